"""The paged K/V tensors (minispec/base/kv_cache.py): a block is zeroed before its first use, only once,
and the bytes held follow the blocks handed out."""

import torch

from minispec.base.kv_cache import KVCache


def test_a_block_is_zeroed_before_its_first_use_and_only_then():
    kv = KVCache(2, 8, 4, 1, 2, torch.float32, "cpu")
    kv.k.fill_(float("nan"))
    kv.v.fill_(float("nan"))
    kv.ready(3)
    assert kv.num_blocks_ready == 3
    assert torch.count_nonzero(kv.k[:, :3]) == 0 and torch.count_nonzero(kv.v[:, :3]) == 0
    assert torch.isnan(kv.k[:, 3:]).all()  # blocks not handed out yet are left untouched
    kv.k[:, 0] = 1.0  # a written block is not zeroed again when more blocks come into use
    kv.ready(2)
    kv.ready(5)
    assert (kv.k[:, 0] == 1.0).all() and torch.count_nonzero(kv.k[:, 3:5]) == 0
    assert kv.num_blocks_ready == 5
