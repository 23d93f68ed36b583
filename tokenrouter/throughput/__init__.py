"""The throughput model of delayed batching: the DTMC (`dtmc`), the search for B* (`optimize`), a
discrete-event simulator (`simulate`), the routing matrices a policy implies (`inputs`, `policy`), the
profile file (`profile`) and the plot (`plot`). It reads plans; the compiler never imports it, nor does the
runtime (`profile.py` drives the runtime to time a model). See docs/tuning.md."""
