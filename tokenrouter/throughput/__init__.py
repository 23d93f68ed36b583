"""The throughput model of delayed batching: the DTMC (`dtmc`), the search for B* (`optimize`), a
discrete-event simulator (`simulate`), the routing matrices a policy implies (`inputs`, `policy`), the
profile file (`profile`) and the plot (`plot`). See docs/throughput.md."""
