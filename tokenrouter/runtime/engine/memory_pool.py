"""The two pools of the paged KV cache (SGLang's vocabulary; page size 1, so a page is one token slot).

- `ReqToTokenPool`: the request-to-token table `req_to_token` [size + 1, max_context_len] int32. Row r lists,
  in sequence order, the KV slots of the request that holds row r. Row 0 is reserved (all zeros: padding
  rows of a graph batch read it); `alloc` hands out rows 1..size.
- `MHATokenToKVPool`: per layer `k_buffer[l]` / `v_buffer[l]` [size + 1, num_kv_heads, head_dim]. Slot 0
  is the reserved dummy slot (padding tokens write there; never handed out); `alloc_extend` /
  `alloc_decode` hand out slots 1..size, `free` takes them back.

Who owns what: the engine decides which request holds which row and slots and writes `req_to_token`; the
attention backend writes K/V through `set_kv_buffer` and reads both. Allocation is host-side bookkeeping
(a CPU int64 tensor of free ids); it never syncs with the device. `free` costs the slots it frees, not the pool:
the freed ids wait in a list, and are appended to the free tensor (one `torch.cat`) only when an allocation
needs more than the tensor holds, so slots are handed out in exactly the order of freeing all along. (With one
`torch.cat` of the whole free tensor per request freed, a warm-up step took about 9 ms a row where two
subservers warmed up at once on the H200 machine, 0.6 ms with one.)
"""

from __future__ import annotations

import torch


class ReqToTokenPool:
    def __init__(self, size: int, max_context_len: int, device: torch.device | str) -> None:
        if size < 1 or max_context_len < 1:
            raise ValueError("ReqToTokenPool needs size >= 1 and max_context_len >= 1")
        self.size = size
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        self.req_to_token = torch.zeros((size + 1, max_context_len), dtype=torch.int32, device=self.device)
        self.free_slots: list[int] = list(range(size, 0, -1))  # pop() hands out the lowest first

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self) -> int | None:
        """One free row, or None when all are taken."""
        return self.free_slots.pop() if self.free_slots else None

    def free(self, index: int) -> None:
        if not 1 <= index <= self.size:
            raise ValueError(f"request slot {index} is out of range 1..{self.size}")
        self.free_slots.append(index)

    def write(self, index: int, start: int, locs: torch.Tensor) -> None:
        """req_to_token[index, start : start + len(locs)] = locs."""
        self.req_to_token[index, start : start + locs.numel()] = locs.to(self.req_to_token.device)


class MHATokenToKVPool:
    def __init__(
        self,
        size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: torch.device | str,
    ) -> None:
        if size < 1:
            raise ValueError("the KV pool needs at least one token slot")
        self.size = size
        self.dtype = dtype
        self.head_num = head_num
        self.head_dim = head_dim
        self.layer_num = layer_num
        self.device = torch.device(device)
        shape = (size + 1, head_num, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(layer_num)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(layer_num)]
        self.free_pages = torch.arange(1, size + 1, dtype=torch.int64)
        self._freed: list[torch.Tensor] = []  # freed after free_pages, in order; appended on demand
        self._freed_n = 0

    @staticmethod
    def bytes_per_token(dtype: torch.dtype, head_num: int, head_dim: int, layer_num: int) -> int:
        return 2 * layer_num * head_num * head_dim * torch.empty((), dtype=dtype).element_size()

    @classmethod
    def size_for_budget(
        cls, mem_bytes: int, dtype: torch.dtype, head_num: int, head_dim: int, layer_num: int
    ) -> int:
        """Token slots that fit in `mem_bytes` (the reserved slot included)."""
        return mem_bytes // cls.bytes_per_token(dtype, head_num, head_dim, layer_num) - 1

    def available_size(self) -> int:
        return int(self.free_pages.numel()) + self._freed_n

    def alloc(self, need: int) -> torch.Tensor | None:
        """`need` free slots (CPU int64), or None if fewer are free (then nothing is taken)."""
        if need > self.free_pages.numel():
            if need > self.free_pages.numel() + self._freed_n:
                return None
            self.free_pages = torch.cat([self.free_pages, *self._freed])
            self._freed, self._freed_n = [], 0
        out, self.free_pages = self.free_pages[:need], self.free_pages[need:]
        return out

    def alloc_extend(self, num_tokens: int) -> torch.Tensor | None:
        """Slots for the new tokens of a prefill/extend step (page size 1: same as `alloc`)."""
        return self.alloc(num_tokens)

    def alloc_decode(self, batch_size: int) -> torch.Tensor | None:
        """One slot per decoding request."""
        return self.alloc(batch_size)

    def free(self, indices: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        indices = indices.to(device="cpu", dtype=torch.int64).flatten()
        self._freed.append(indices)
        self._freed_n += int(indices.numel())

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffer[layer_id][loc] = k.to(self.dtype)
        self.v_buffer[layer_id][loc] = v.to(self.dtype)
