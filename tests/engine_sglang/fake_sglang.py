"""A CPU stand-in for the part of SGLang 0.5.17 that `SGLangEngine` drives, to test its bookkeeping in CI.

It mirrors the contracts the engine relies on, as read in SGLang 0.5.17's source: `ReqToTokenPool` (a
`req_to_token` [size + 1, context] int32 table, row 0 reserved, `alloc(reqs)` sets each new req's
`req_pool_idx`, `free(req)` clears it), the token-to-KV allocator (slots 1..size, `alloc(n)` -> an int64 tensor
or None, `free(tensor)`), and `ModelRunner.forward(ForwardBatch)` -> `.logits_output.next_token_logits`
(float32 whatever the model's dtype: SGLang's LogitsProcessor casts them) / `.hidden_states` and
`.can_run_graph`.

The stand-in "KV cache" stores, per slot, the token and position written there. Its forward checks the batch
the way SGLang's kernels would use it (DECODE: one token per row at position seq_len - 1; EXTEND: prefix +
extend lengths, start offsets, positions), writes the new tokens at `out_cache_loc`, then, per row, reads the
row's slots `req_to_token[row, :seq_len]` back, checks every slot holds the right position, and runs the real
tiny model over the tokens it read. Any bookkeeping mistake of the engine (wrong or stale slots, a misplaced
prefix, a lost hold) changes the tokens read back, hence the logits, and the contract suite fails.
"""

from __future__ import annotations

import enum
from types import SimpleNamespace

import torch

from tokenrouter.runtime.engine.sglang_engine import SGLangEngine, SGLangSettings


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2


class CaptureHiddenMode(enum.IntEnum):
    NULL = 0
    LAST = 1


class ForwardBatch(SimpleNamespace):
    pass


class ReqToTokenPool:
    def __init__(self, size: int, context: int) -> None:
        self.size = size
        self.req_to_token = torch.zeros((size + 1, context), dtype=torch.int32)
        self.free_slots = list(range(1, size + 1))

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, reqs):
        assert all(r.req_pool_idx is None for r in reqs), "only new requests get a row"
        if len(reqs) > len(self.free_slots):
            return None
        for r in reqs:
            r.req_pool_idx = self.free_slots.pop(0)
        return [r.req_pool_idx for r in reqs]

    def free(self, req) -> None:
        assert req.req_pool_idx is not None
        assert req.req_pool_idx not in self.free_slots, "row freed twice"
        self.free_slots.append(req.req_pool_idx)
        req.req_pool_idx = None


class TokenAllocator:
    def __init__(self, size: int) -> None:
        self.size = size
        self.free_pages = torch.arange(1, size + 1, dtype=torch.int64)

    def available_size(self) -> int:
        return len(self.free_pages)

    def alloc(self, n: int):
        if n > len(self.free_pages):
            return None
        out, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return out

    def free(self, index: torch.Tensor) -> None:
        assert not set(index.tolist()) & set(self.free_pages.tolist()), "slot freed twice"
        self.free_pages = torch.cat([self.free_pages, index])


class FakeRunner:
    device = "cpu"
    gpu_id = 0

    def __init__(self, engine, pool: int, reqs: int, graphs: bool = True) -> None:
        self.model_engine = engine  # an EmbeddedEngine: the weights
        self.dtype = engine.dtype
        self.model = SimpleNamespace(get_input_embeddings=lambda: engine.model.model.embed_tokens)
        self.model_config = SimpleNamespace(context_len=engine.model_config.max_position_embeddings)
        self.req_to_token_pool = ReqToTokenPool(reqs, self.model_config.context_len)
        self.token_to_kv_pool_allocator = TokenAllocator(pool)
        self.decode_cuda_graph_runner = object() if graphs else None
        self.kv_token = torch.full((pool + 1,), -1, dtype=torch.int64)
        self.kv_pos = torch.full((pool + 1,), -1, dtype=torch.int64)

    def forward(self, fb: ForwardBatch):
        bs, ids, pos = fb.batch_size, fb.input_ids, fb.positions
        seq = fb.seq_lens
        assert fb.seq_lens_sum == int(seq.sum()) and fb.seq_lens_cpu.tolist() == seq.tolist()
        assert len(fb.req_pool_indices) == bs and len(fb.out_cache_loc) == len(ids) == len(pos)
        assert int(fb.out_cache_loc.min()) >= 1, "slot 0 is reserved"
        if fb.forward_mode == ForwardMode.DECODE:
            assert len(ids) == bs and pos.tolist() == (seq - 1).tolist()
        else:
            ext, pre = fb.extend_seq_lens.long(), fb.extend_prefix_lens.long()
            assert fb.extend_seq_lens_cpu == ext.tolist() and fb.extend_prefix_lens_cpu == pre.tolist()
            assert (pre + ext).tolist() == seq.tolist() and fb.extend_num_tokens == len(ids)
            assert fb.extend_start_loc.tolist() == (torch.cumsum(ext, 0) - ext).tolist()
            want = torch.cat(
                [torch.arange(p, p + e) for p, e in zip(pre.tolist(), ext.tolist(), strict=True)]
            )
            assert pos.tolist() == want.tolist()
        self.kv_token[fb.out_cache_loc] = ids
        self.kv_pos[fb.out_cache_loc] = pos
        logits, hidden = [], []
        for row, n in zip(fb.req_pool_indices.tolist(), seq.tolist(), strict=True):
            slots = self.req_to_token_pool.req_to_token[row, :n].long()
            assert self.kv_pos[slots].tolist() == list(range(n)), "a slot holds another position"
            lg, hs = self.model_engine.forward_full(self.kv_token[slots])
            logits.append(lg[-1])
            hidden.append(hs[-1])
        last = fb.capture_hidden_mode == CaptureHiddenMode.LAST
        out = SimpleNamespace(
            next_token_logits=torch.stack(logits).float(), hidden_states=torch.stack(hidden) if last else None
        )
        graph = fb.forward_mode == ForwardMode.DECODE and self.decode_cuda_graph_runner is not None
        return SimpleNamespace(logits_output=out, can_run_graph=graph)


def fake_sglang_engine(embedded, pool: int, max_batch: int = 8) -> SGLangEngine:
    """An SGLangEngine over the stand-in runner, with `embedded`'s model as the weights."""
    names = SimpleNamespace(
        ForwardBatch=ForwardBatch,
        ForwardMode=ForwardMode,
        CaptureHiddenMode=CaptureHiddenMode,
        SpeculativeAlgorithm=SimpleNamespace(NONE=None),
    )
    runner = FakeRunner(embedded, pool, reqs=2 * max_batch)
    settings = SGLangSettings(device="cpu", max_batch=max_batch)
    return SGLangEngine(runner, embedded.model_config, settings, "fake-sglang", names)
