"""The Triton kernels of the GPU fast path, by kind: `attention` (paged attention and its split merge, with the
launch-shape rules in `attention_shapes`), `elementwise` (norms, rotary embedding, SiLU * up, the K/V store),
`linear` (the one- and few-row GEMVs) and `dot_rows` (few-row linear layers on tensor cores); `common` holds
what they share (programmatic dependent launch, the autotuner). `attention/triton_backend.py` decides per
step which of them run."""
