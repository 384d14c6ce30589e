"""When a warming engine is warm: its warmup requests' TTFT has settled, not after a fixed count.

The first requests after a start are slower (vLLM compiles and allocates lazily: on this CPU the first TTFT
was 44-99 ms against 16-33 ms warm, docs/design.md; on a GPU CUDA graphs and the allocator add more). A fixed
count either wastes time or lets a still-cold engine take traffic, so the agent keeps sending warmup
requests until the last ``settle_count`` TTFTs lie within ``settle_tolerance`` of each other (or within
``settle_floor_seconds``, for TTFTs so small that noise is the whole difference), bounded by
``max_requests``. Pure: the supervisor sends the requests and asks here whether to stop.
"""

from __future__ import annotations

from agent.config import WarmupConfig


def settled(ttfts: list[float], tolerance: float, floor: float) -> bool:
    """The TTFTs lie within ``tolerance`` (relative to the smallest) or ``floor`` seconds of each other."""
    if not ttfts:
        return False
    low, high = min(ttfts), max(ttfts)
    return high - low <= max(tolerance * low, floor)


def warmup_done(ttfts: list[float], warmup: WarmupConfig) -> bool:
    """Enough warmup requests answered with these TTFTs (oldest first)?"""
    n = len(ttfts)
    if warmup.requests == 0 or n >= warmup.max_requests:
        return True
    if n < warmup.requests:
        return False
    if warmup.settle_count <= 1:
        return True
    if n < warmup.settle_count:
        return False
    return settled(ttfts[-warmup.settle_count:], warmup.settle_tolerance, warmup.settle_floor_seconds)


def warmup_summary(ttfts: list[float], warmup: WarmupConfig) -> str:
    """The READY event's message: how warmup ended, with the TTFTs in milliseconds."""
    if not ttfts:
        return "warm and serving (no warmup requests)"
    shown = " ".join(f"{t * 1000:.1f}" for t in ttfts[-20:])
    k = warmup.settle_count
    if k > 1 and len(ttfts) >= k and settled(ttfts[-k:], warmup.settle_tolerance, warmup.settle_floor_seconds):
        how = f"TTFT settled after {len(ttfts)} warmup requests"
    elif k > 1:
        how = f"TTFT not settled after {len(ttfts)} warmup requests (max_requests)"
    else:
        how = f"{len(ttfts)} warmup requests answered"
    return f"warm and serving: {how}; TTFT ms: {shown}"
