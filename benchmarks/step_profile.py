"""Where a graphed decode step's time goes, kernel by kernel: a forced greedy step of a preset
(random weights) replayed from its CUDA graphs under the torch profiler. Under PDL a kernel
starts while the one before still runs (it prefetches its weights, then waits), so a kernel's
own duration overstates it: each kernel is charged the time its end adds to the ends before it.
Printed per position in a decoder layer (the median over the middle layers and the steps), then
the last layer and the step's tail (the final norm, the logits and the choice).

    python3 benchmarks/step_profile.py large-v3:1:float16 large-v3:16:float16 \\
        large-v3:1:int8_float16 large-v3-turbo:1:float16
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpu import eot_for, prompt_for
from tune_step import step_ms

from whisperforge import quantize
from whisperforge.presets import preset, random_model
from whisperforge.runtime import Runtime


def kernels(fn) -> list[dict]:
    """The CUDA kernels `fn` runs, in start order (name, ts and dur in µs)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        prof.export_chrome_trace(trace.name)
        events = json.loads(Path(trace.name).read_text())["traceEvents"]
    return sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])


def added_times(events: list[dict], before: float) -> list[float]:
    """What each kernel's end adds to the latest end before it (µs), from `before`."""
    added, latest = [], before
    for e in events:
        end = e["ts"] + e["dur"]
        added.append(max(0.0, end - latest))
        latest = max(latest, end)
    return added


def profile_step(name: str, batch: int, compute_type: str, steps: int) -> None:
    c = preset(name)
    model = random_model(c, seed=0, device="cuda", dtype=torch.float16)
    if compute_type != "float16":
        quantize.quantize_model(model, quantize.COMPUTE_TYPES[compute_type][1])
    rt = Runtime(model, "float16", max_windows=batch, max_rows=batch)
    torch.manual_seed(0)
    mel = torch.randn(batch, c.n_mels, 3000, device="cuda", dtype=torch.float16)
    features = rt.encoder(mel).clone()
    prompt, eot = prompt_for(c), eot_for(c)
    ms = step_ms(rt, features, prompt, eot, 128)  # warms and captures the graphs
    batch_state = rt.prefill(rt.cross(features), [prompt] * batch)
    torch.cuda.synchronize()
    events = kernels(lambda: rt.greedy(batch_state, steps, eot, suppress=[eot], stop=False))
    # A step starts at its embedding kernel; the first and last few are left out.
    starts = [i for i, e in enumerate(events) if "embed" in e["name"]]
    layers = c.n_text_layer
    by_position: dict[tuple[int, str], list[float]] = collections.defaultdict(list)
    totals = []
    for first, after in itertools.pairwise(starts[2:-1]):
        step = events[first:after]
        before = events[first - 1]["ts"] + events[first - 1]["dur"]
        added = added_times(step, before)
        totals.append(sum(added))
        per_layer = (len(step) - 1) // layers
        last_layer = 1 + per_layer * (layers - 1)
        by_position[-1, "embedding + norm"].append(added[0])
        for i in range(1 + per_layer, last_layer):  # the middle layers
            by_position[(i - 1) % per_layer, step[i]["name"][:44]].append(added[i])
        for i in range(last_layer, len(step)):
            by_position[100 + i - last_layer, "last layer, tail: " + step[i]["name"][:26]].append(
                added[i]
            )
    print(
        f"== {name} batch {batch} {compute_type}: {ms:.4f} ms a step graphed (events), "
        f"{statistics.median(totals):.1f} µs profiled, {per_layer} kernels a layer"
    )
    for (position, kernel), times in sorted(by_position.items()):
        print(f"  {position:4d} {kernel:48s} {statistics.median(times):7.2f} µs", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", help="preset:batch:compute_type")
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    for spec in args.specs:
        name, batch, compute_type = spec.split(":")
        profile_step(name, int(batch), compute_type, args.steps)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
