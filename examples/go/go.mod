module idemd.dev/idem/examples

go 1.19

require idemd.dev/idem v0.0.0

replace idemd.dev/idem => ../../client/go
