"""``stagefate bench copy``: the copy path's throughput as a ratio to a raw ``Tensor.copy_``.

Both sides move the same bytes in the same run: the path gathers bounce slots and scatters them
into device slots (``CopyEngine.h2d``); the baseline copies one contiguous tensor of that size.
On a machine without a GPU both run on the CPU.
"""

from __future__ import annotations

import torch

from ..runtime import CopyEngine, DevicePool, HostPool, KVLayout
from .report import Section, median_seconds, table


def run(tokens: int = 2048, repeats: int = 9) -> Section:
    layout = KVLayout(layers=8, kv_heads=8, head_dim=128, dtype=torch.float16)
    host = HostPool(layout, tokens)
    device = DevicePool(layout, tokens, "auto")
    engine = CopyEngine(device.device)
    src = host.alloc(tokens)
    dst = device.alloc(tokens)
    assert src is not None and dst is not None
    src, dst = src[torch.randperm(tokens)], dst[torch.randperm(tokens)]  # scattered, as in use
    raw_src = torch.empty(layout.shape(tokens), dtype=layout.dtype)
    if device.device.type == "cuda":
        raw_src = raw_src.pin_memory()
    raw_dst = torch.empty(layout.shape(tokens), dtype=layout.dtype, device=device.device)

    def path() -> None:
        engine.h2d(host, src, device, dst).wait()

    def raw() -> None:
        raw_dst.copy_(raw_src, non_blocking=True)
        if device.device.type == "cuda":
            torch.cuda.synchronize()

    path()  # warm up
    raw()
    nbytes = tokens * layout.bytes_per_token
    path_s, raw_s = median_seconds(path, repeats), median_seconds(raw, repeats)
    ratio = raw_s / path_s
    body = table(
        ["copy", "bytes", "median ms", "GB/s", "ratio to raw"],
        [
            [
                "raw `Tensor.copy_` (contiguous)",
                f"{nbytes / 2**20:.0f} MiB",
                f"{raw_s * 1e3:.2f}",
                f"{nbytes / raw_s / 1e9:.2f}",
                "1.00",
            ],
            [
                "`CopyEngine.h2d` (gather + scatter)",
                f"{nbytes / 2**20:.0f} MiB",
                f"{path_s * 1e3:.2f}",
                f"{nbytes / path_s / 1e9:.2f}",
                f"{ratio:.2f}",
            ],
        ],
    )
    body += (
        f"\n\nDevice: {device.device}. {tokens} tokens of {layout.bytes_per_token} bytes, "
        f"scattered slot order, median of {repeats}. Target: ratio ≥ 0.8 "
        f"(**{'met' if ratio >= 0.8 else 'NOT met'}**)."
    )
    return Section("copy", "Copy path: host → device vs raw copy", body)
