"""Peers measured in the same run: torch SDPA on the contiguous problem, FlexAttention paged."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def sdpa_stacked(q: torch.Tensor, k_slab: torch.Tensor, v_slab: torch.Tensor):
    """The dense/cascade problem for torch SDPA: one group's B queries stacked as B*G rows per KV
    head, against one contiguous prefix copy. q [B, n_q, d]; k/v_slab [L, n_kv, d].
    Returns a closure running SDPA on [1, n_kv, B*G, d] x [1, n_kv, L, d] (inputs made once)."""
    B, n_q, d = q.shape
    n_kv = k_slab.shape[1]
    G = n_q // n_kv
    qs = q.view(B, n_kv, G, d).permute(1, 0, 2, 3).reshape(1, n_kv, B * G, d).contiguous()
    ks = k_slab.permute(1, 0, 2).unsqueeze(0).contiguous()
    vs = v_slab.permute(1, 0, 2).unsqueeze(0).contiguous()
    return lambda: F.scaled_dot_product_attention(qs, ks, vs)


def sdpa_stacked_out(q, k_slab, v_slab):
    """The same, returning o in [B, n_q, d] (for checking the peer computes the same thing)."""
    B, n_q, d = q.shape
    n_kv = k_slab.shape[1]
    G = n_q // n_kv
    o = sdpa_stacked(q, k_slab, v_slab)()            # [1, n_kv, B*G, d]
    return o[0].view(n_kv, B, G, d).permute(1, 0, 2, 3).reshape(B, n_q, d)


def flex_paged(q: torch.Tensor, k_phys: torch.Tensor, v_phys: torch.Tensor, pages: torch.Tensor,
               page_size: int, compiled: bool = True):
    """FlexAttention decode over a paged KV layout: physical caches [1, n_kv, n_pages * page, d]
    (Flex's head-major layout), request b reads the pages pages[b] ([B, P] int32, all full)
    through a BlockMask whose KV blocks are the physical pages (block size = page size).
    Returns a closure producing o [B, n_q, 1, d]."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    B, n_q, d = q.shape
    P = pages.shape[1]
    n_phys = k_phys.shape[2]
    qf = q.unsqueeze(2)                                          # [B, n_q, 1, d]
    num = torch.full((B, 1, 1), P, dtype=torch.int32, device=q.device)
    n_blocks = n_phys // page_size  # Flex wants the index rows as long as the physical block count
    idx = torch.zeros(B, 1, 1, n_blocks, dtype=torch.int32, device=q.device)
    idx[:, 0, 0, :P] = pages.to(torch.int32)
    owned = torch.zeros(B, n_blocks, dtype=torch.bool, device=q.device)   # request b owns page p
    owned.scatter_(1, pages.long(), True)

    def mask_mod(b, h, q_idx, kv_idx):  # only evaluated by the unfused (eager) path: blocks are full
        return owned[b, kv_idx // page_size]

    bm = BlockMask.from_kv_blocks(num, idx, full_kv_num_blocks=num, full_kv_indices=idx,
                                  BLOCK_SIZE=(page_size, page_size), mask_mod=mask_mod,
                                  seq_lengths=(1, n_phys))
    fn = torch.compile(flex_attention) if compiled else flex_attention
    return lambda: fn(qf, k_phys, v_phys, block_mask=bm, enable_gqa=True)
