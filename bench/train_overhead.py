#!/usr/bin/env python3
"""What `tierax train`'s loop costs over a minimal hand-written JAX training step.

Both train the same model under the same plan, optimizer and batch size on the same
mesh.  The loop does everything `tierax train` does per step (reads the batch from
the token file, assembles it with `jax.make_array_from_process_local_data`, reads the
metrics back, writes `metrics.jsonl`, drives the rich progress display on a terminal
console); the baseline is `jit(value_and_grad + optax update)` with donated state on
one batch already on the devices, synchronised once per round.  They run interleaved,
round by round, in alternating order (loop first in even rounds, baseline first in odd
ones), so machine noise and drift hit both alike; the ratio is the median over rounds of
(loop step time / baseline step time) within a round, the ratio of the medians is
recorded too.  Checkpointing is off (it is I/O, not loop).

    .venv/bin/python bench/train_overhead.py [--config configs/demo-train.yaml] [KEY=VALUE ...]

writes bench/results/train_overhead.json and prints the ratio.
"""

from __future__ import annotations

import argparse
import io
import pathlib
import statistics
import sys
import tempfile
import time

import _common

from tierax.launch import flags as xla_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "demo-train.yaml"))
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    ap.add_argument("--rounds", type=int, default=21, help="timed rounds (after one warm-up round)")
    ap.add_argument("--steps-per-round", type=int, default=16)
    _common.add_out(ap, "train_overhead.json")
    args = ap.parse_args(argv)
    from tierax.train import config as train_config  # imports JAX: after the arguments

    work = pathlib.Path(tempfile.mkdtemp(prefix="tierax-overhead-"))
    n, rounds = args.steps_per_round, args.rounds
    probe = train_config.load_train_config(args.config, args.overrides)
    extra = [
        f"log.dir={work / 'run'}",
        "checkpoint.every=0",
        "log.plot=false",
        f"steps={(rounds + 1) * n}",
    ]
    if probe.data.source == "tokens":
        extra.append(f"data.path={work / 'tokens'}")
    cfg = train_config.load_train_config(args.config, [*args.overrides, *extra])
    xla_flags.configure(
        cpu_devices=None if xla_flags.expects_gpu() else cfg.mesh.size, preset=cfg.xla_preset
    )

    import jax
    import optax
    from rich.console import Console

    from tierax import plan as plan_lib
    from tierax.train import data as data_lib
    from tierax.train import loop
    from tierax.train import step as step_lib
    from tierax.train.progress import RichReporter
    from tierax.train.schedule import lr_schedule

    if cfg.data.source == "tokens":
        data_lib.prepare_text(ROOT / "data" / "sample.txt", work / "tokens")

    # --- tierax train's loop, with a live progress display rendered into memory ---------
    console = Console(file=io.StringIO(), force_terminal=True, width=160)
    trainer = loop.Trainer(cfg, reporter=RichReporter(console, cfg.log.every))

    # --- the hand-written baseline -------------------------------------------------------
    mesh = cfg.mesh.make()
    o = cfg.optimizer
    optimizer = step_lib.make_optimizer(
        lr_schedule(cfg), o.weight_decay, b1=o.b1, b2=o.b2, eps=o.eps, grad_clip=o.grad_clip
    )
    graphdef, state = step_lib.init_state(cfg.model, optimizer, seed=cfg.seed, mesh=mesh)
    loss_fn = step_lib.make_loss_fn(graphdef, plan_lib.to_policies(cfg.plan, cfg.model))

    def hand_step(state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(state.params, tokens)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        return step_lib.TrainState(
            optax.apply_updates(state.params, updates), opt_state, state.step + 1
        ), loss

    hand = jax.jit(
        hand_step, donate_argnums=(0,), out_shardings=(step_lib.shardings_of(state), None)
    )
    tokens = trainer.batch(1)  # the loop's own first batch, already on the devices

    def run_hand(state):
        for _ in range(n):
            state, loss = hand(state, tokens)
        jax.block_until_ready(loss)
        return state

    def run_loop():
        trainer.train(until=trainer.step + n)

    state = run_hand(state)  # warm-up round (first executions) for both
    run_loop()
    loop_s, hand_s = [], []
    for r in range(rounds):
        for which in ("loop", "hand") if r % 2 == 0 else ("hand", "loop"):
            t0 = time.perf_counter()
            if which == "loop":
                run_loop()
                loop_s.append((time.perf_counter() - t0) / n)
            else:
                state = run_hand(state)
                hand_s.append((time.perf_counter() - t0) / n)
    trainer.close()

    paired = [a / b for a, b in zip(loop_s, hand_s, strict=False)]
    ratio = statistics.median(paired)
    doc = _common.envelope("tierax.measure.bench.train_overhead/1", argv, devices=True) | {
        "config": cfg.to_dict(),
        "rounds": rounds,
        "steps_per_round": n,
        "loop_step_s": loop_s,
        "baseline_step_s": hand_s,
        "loop_median_step_s": statistics.median(loop_s),
        "baseline_median_step_s": statistics.median(hand_s),
        "ratio": ratio,
        "paired_ratios": paired,
        "ratio_of_medians": statistics.median(loop_s) / statistics.median(hand_s),
        "overhead_pct": 100 * (ratio - 1),
        "within_5pct": ratio <= 1.05,
        "note": "ratio: median over rounds of loop/baseline step time in the same round (order "
        "alternating); the loop reads data, metrics and logs every step, the baseline reuses one "
        "on-device batch and synchronises once per round",
    }
    _common.write_record(args.out, doc)
    print(
        f"tierax train loop {statistics.median(loop_s) * 1e3:.1f} ms/step vs hand-written step "
        f"{statistics.median(hand_s) * 1e3:.1f} ms/step: ratio {ratio:.3f} "
        f"({100 * (ratio - 1):+.1f} %); wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
