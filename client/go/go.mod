module idemd.dev/idem

go 1.19
