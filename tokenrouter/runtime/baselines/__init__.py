"""The serving baselines TokenRouter is measured against on the same engine (`serve --mode`, `modes.py`):
`lockstep` (one process drives every model synchronously) and `std_serving` (every hop a new request to a
prefix-caching server). The other modes are plan rewrites in `modes.py`."""
