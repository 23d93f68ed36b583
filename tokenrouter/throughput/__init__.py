"""The throughput model of delayed batching: the DTMC (`dtmc`), the search for B* (`optimize`), a
discrete-event simulator (`simulate`, its settings in `sim_config`), the routing matrices a policy implies
(`inputs`, `policy`), the profile file (`profile`), the plot (`plot`), and the bodies of the `tune`,
`simulate` and `profile` commands (`commands`, one module each). It reads plans; the compiler never imports
it, nor does the runtime (`profile.py` drives the runtime to time a model). See docs/tuning.md."""
