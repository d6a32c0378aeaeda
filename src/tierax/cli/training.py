"""Verbs of a training run: train, data, plot-metrics."""

from __future__ import annotations

import dataclasses
import json
import sys

from tierax import launch
from tierax.cli.common import console, note_local_fp8, prepare_progress


def cmd_train(args) -> int:
    from tierax.train import config as train_config

    # Everything up to start_training reads files and validates; JAX's backend starts there.
    cfg = train_config.load_train_config(args.config, args.overrides)
    cfg.check_outputs()
    dist = launch.Distributed.resolve(args.coordinator, args.num_processes, args.process_id)
    env_lines = launch.start_training(cfg, dist, debug=args.debug)
    model = launch.local_attention(
        cfg.model,
        what="tierax train",
        documents=cfg.data.document_mask,
        set_example="model.attention=",  # a train config's key (or that override)
    )
    if model is not cfg.model:  # attention: auto, chosen for this backend
        cfg = dataclasses.replace(cfg, model=model)
    launch.check_local_memory(cfg.model, shards=cfg.mesh.size, what="tierax train")
    note_local_fp8(cfg.model, "tierax train")
    import jax

    from tierax.train import loop
    from tierax.train.progress import Reporter, RichReporter

    c = console()
    say = c.print if jax.process_index() == 0 and not args.json else (lambda *a, **k: None)
    for line in [*env_lines, *([_verify(cfg)] if args.verify else [])]:
        say(line)
    reporter = Reporter() if args.json else RichReporter(c, cfg.log.every)
    try:
        result = loop.run(cfg, resume=args.resume, reporter=reporter)
    except (loop.NonFiniteLoss, loop.Stopped) as e:
        print(f"tierax train: {e}", file=sys.stderr)
        _plot(cfg, say)  # the steps that ran
        return 130 if isinstance(e, loop.Stopped) else 1
    _plot(cfg, say)
    if args.json:
        print(
            json.dumps(
                {"process_index": jax.process_index(), "process_count": jax.process_count()}
                | result.to_json()
            )
        )
    else:
        say(result.summary(cfg))
    return 0


def _verify(cfg) -> str:
    from tierax.measure.gate import verify_before_training

    return verify_before_training(cfg)


def _plot(cfg, say) -> None:
    import jax

    from tierax.train.run_dir import read_metrics

    if cfg.log.plot and jax.process_index() == 0 and read_metrics(cfg.log.dir):
        from tierax.report.metrics_plot import plot_metrics

        say(f"metrics plot: {plot_metrics(cfg.log.dir)}")


def cmd_data(args) -> int:
    from tierax.cli.common import console as make_console
    from tierax.train import data

    c = make_console(stderr=True)
    with prepare_progress(c, data.input_bytes(args.inputs)) as advance:
        index = data.prepare(
            args.inputs,
            args.out,
            tokenizer=args.tokenizer,
            field=args.field,
            validation_fraction=args.validation_fraction,
            shard_tokens=args.shard_tokens,
            bos=args.bos,
            eos=args.eos,
            max_document_bytes=args.max_document_mib << 20,
            overwrite=args.overwrite,
            progress=advance,
        )
    tok = index["tokenizer"]
    for name, split in index["splits"].items():
        print(
            f"{name}: {split['num_tokens']:,} tokens in {split['num_documents']:,} documents, "
            f"{len(split['shards'])} shard(s)"
        )
    bos = tok["bos_id"] if tok["add_bos"] else "none"
    eos = "none" if tok["eos_id"] is None else tok["eos_id"]
    print(
        f"wrote {args.out} ({tok['kind']} tokenizer, vocab {tok['vocab_size']}, "
        f"{index['dtype']}; BOS {bos}, EOS {eos}) with {args.out}/{data.INDEX}"
    )
    return 0


def cmd_plot_metrics(args) -> int:
    from tierax.fileio import check_replaceable_file
    from tierax.report.metrics_plot import check_png_name, is_metrics_png, plot_metrics

    if args.out:  # (the default, RUN_DIR/metrics.png, is the run's own: `tierax train` writes it)
        check_png_name(args.out)
        check_replaceable_file(
            args.out, ours=is_metrics_png, what="a metrics plot tierax wrote", force=args.force
        )
    wrote = plot_metrics(
        args.run_dir, args.out, note=lambda s: print(f"note: {s}", file=sys.stderr)
    )
    print(f"wrote {wrote}")
    return 0
