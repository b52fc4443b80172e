"""``stagefate bench copy``: the copy path's throughput as a ratio to a raw ``Tensor.copy_``.

Both sides move the same bytes in the same run: the path gathers bounce slots and scatters them
into device slots (``CopyEngine.h2d``), once with slots in runs as the pools hand them out and once
fully scattered; the baseline copies one contiguous tensor of that size.
On a machine without a GPU both run on the CPU.
"""

from __future__ import annotations

import torch

from ..runtime import CopyEngine, DevicePool, HostPool, KVLayout
from .report import Section, median_seconds, table


def run(device_name: str = "auto", tokens: int = 2048, repeats: int = 9) -> Section:
    layout = KVLayout(layers=8, kv_heads=8, head_dim=128, dtype=torch.float16)
    host = HostPool(layout, tokens)
    device = DevicePool(layout, tokens, device_name)
    engine = CopyEngine(device.device)
    src = host.alloc(tokens)
    dst = device.alloc(tokens)
    assert src is not None and dst is not None
    scattered_src, scattered_dst = src[torch.randperm(tokens)], dst[torch.randperm(tokens)]
    # Every buffer is written first: untouched memory reads as the kernel's shared zero page,
    # which would flatter whichever side still has some.
    host.kv.fill_(1.0)
    raw_src = torch.ones(layout.shape(tokens), dtype=layout.dtype)
    if device.device.type == "cuda":
        raw_src = raw_src.pin_memory()
    raw_dst = torch.empty(layout.shape(tokens), dtype=layout.dtype, device=device.device)

    def raw() -> None:
        raw_dst.copy_(raw_src, non_blocking=True)
        if device.device.type == "cuda":
            torch.cuda.synchronize()

    nbytes = tokens * layout.bytes_per_token
    raw()  # warm up
    raw_s = median_seconds(raw, repeats)
    rows: list[list[object]] = [
        ["raw `Tensor.copy_` (contiguous)", *_figures(nbytes, raw_s, raw_s)]
    ]
    ratios = {}
    for name, (source, destination) in {
        "runs (slots as a pool hands them out)": (src, dst),
        "scattered (random permutations)": (scattered_src, scattered_dst),
    }.items():

        def path(source: torch.Tensor = source, destination: torch.Tensor = destination) -> None:
            engine.h2d(host, source, device, destination).wait()

        path()
        seconds = median_seconds(path, repeats)
        ratios[name] = raw_s / seconds
        rows.append([f"`CopyEngine.h2d`, {name}", *_figures(nbytes, seconds, raw_s)])
    body = table(["copy", "bytes", "median ms", "GB/s", "ratio to raw"], rows)
    runs_ratio = ratios["runs (slots as a pool hands them out)"]
    pinned = "pinned" if host.kv.is_pinned() else "pageable"
    body += (
        f"\n\nDevice: {device.device}, bounce {pinned}. {tokens} tokens of "
        f"{layout.bytes_per_token} bytes, median "
        f"of {repeats}. Target: ratio ≥ 0.8 (**{'met' if runs_ratio >= 0.8 else 'NOT met'}** "
        "for slots in runs). Fully scattered slots take the per-plane gather/scatter; on the CPU "
        "that costs a few times a plain copy (torch's index kernels, not memory bandwidth)."
    )
    if device.device.type == "cuda":
        return Section("copy-cuda", "Copy path on the GPU: pinned host → device vs raw copy", body)
    return Section("copy", "Copy path: host → device vs raw copy", body)


def _figures(nbytes: int, seconds: float, raw_seconds: float) -> list[object]:
    return [
        f"{nbytes / 2**20:.0f} MiB",
        f"{seconds * 1e3:.2f}",
        f"{nbytes / seconds / 1e9:.2f}",
        f"{raw_seconds / seconds:.2f}",
    ]
