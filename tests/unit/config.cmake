idem_unit_test(config)
# server/config_reload.c: the settings a configuration reload keeps, and configuration references.
idem_unit_test(config_reload)
