"""What ``baechi devices calibrate -o FILE`` prints: one line per measured device, the interconnect, the file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from baechi_cli.cli.render.common import fmt_bytes, make_console
from baechi_cli.core.devices import format_si

if TYPE_CHECKING:
    from baechi_cli.app.calibrate import Calibration


def calibration_lines(result: Calibration, output: str) -> list[str]:
    """The summary of ``result``, written to ``output``, as plain lines."""
    lines = [
        f"{m.target} ({m.label}): GEMM {format_si(m.gemm_flops, 'FLOP/s', sep=' ')}, "
        f"model matmuls {m.gemm_efficiency:.3f}x GEMM, "
        f"conv {m.conv_efficiency:.3f}x GEMM, depthwise conv {m.depthwise_efficiency:.3f}x GEMM, "
        f"memory bandwidth {format_si(m.bandwidth, 'B/s', sep=' ')}, "
        f"compute and memory {'overlap' if m.overlap else 'add up'}, "
        f"launch {m.launch_us:.3g} µs, memory {fmt_bytes(m.memory_bytes)}"
        for m in result.measured
    ]
    lines += [f"{f.src} -> {f.dst}: {f.summary()}" for f in result.fits]
    ic = result.spec.interconnect
    source = "measured" if result.fits else "not measured, baechi's default"
    lines.append(
        f"interconnect ({source}): {ic.latency_us:.4g} µs + "
        f"{format_si(ic.bandwidth_bytes_per_us * 1e6, 'B/s', sep=' ')}, {ic.mode}"
    )
    lines.append(f"wrote {output}: {result.spec.count} device(s), in {result.wall_s:.1f} s")
    return lines


def render_calibration(result: Calibration, output: str) -> None:
    """Print :func:`calibration_lines` to stdout."""
    console = make_console()
    for line in calibration_lines(result, output):
        console.print(line, markup=False)
