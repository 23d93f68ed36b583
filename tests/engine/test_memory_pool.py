"""The KV pool's slot bookkeeping: `free` defers the append of the freed ids to the allocation that needs them,
and the slots still come out in the order a plain list (freed ids appended at once) gives them."""

import random

import torch

from tokenrouter.runtime.engine.memory_pool import MHATokenToKVPool


def pool(size: int) -> MHATokenToKVPool:
    return MHATokenToKVPool(size, torch.float32, head_num=1, head_dim=2, layer_num=1, device="cpu")


def test_slots_come_out_in_the_order_a_plain_free_list_gives():
    rng = random.Random(7)
    kv, ref = pool(200), list(range(1, 201))  # the reference: a list, freed ids appended at once
    held: list[list[int]] = []
    for _ in range(2000):
        if held and rng.random() < 0.45:
            slots = held.pop(rng.randrange(len(held)))
            kv.free(torch.tensor(slots, dtype=torch.int64))
            ref += slots
        else:
            need = rng.randint(1, 40)
            got = kv.alloc(need)
            if need > len(ref):
                assert got is None
            else:
                assert got.tolist() == ref[:need]
                ref = ref[need:]
                held.append(got.tolist())
        assert kv.available_size() == len(ref)


def test_a_refused_allocation_takes_nothing():
    kv = pool(10)
    a = kv.alloc(6)
    kv.free(a[:2])
    assert kv.alloc(7) is None  # 4 free + 2 freed
    assert kv.available_size() == 6
    assert kv.alloc(6).tolist() == [7, 8, 9, 10, 1, 2]
    assert kv.available_size() == 0 and kv.alloc(1) is None


def test_freeing_does_not_copy_the_free_list():
    kv = pool(100_000)
    free_before = kv.free_pages
    kv.free(kv.alloc(5))
    kv.free(torch.tensor([], dtype=torch.int64))
    assert kv.free_pages.data_ptr() == free_before[5:].data_ptr()  # still a view: nothing appended yet
    assert kv.available_size() == 100_000
