"""Training and evaluation of the demo models and routers.

- `corpus`: Python standard-library source, split by module unit into LM-train / router / eval parts.
- `tokenizer`: a byte-level BPE tokenizer trained on the LM-train part, saved HF-style.
- `features`, `router_train`, `evaluate`: teacher-forced router training and routing-quality evaluation.

Nothing here is imported by the serving path.
"""
