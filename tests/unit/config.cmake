idem_unit_test(config)
