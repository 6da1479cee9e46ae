"""``python -m deploy.generator [--check] [--control A --treatment B ... --out DIR]``.

Without overrides it (re)renders the committed files under deploy/; a spec with overrides
renders into the directory named by ``--out``, never over the committed files."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from deploy.generator.render import render_all
from deploy.generator.spec import Spec

DEPLOY_DIR = Path(__file__).resolve().parent.parent


def _labels(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def build_spec(argv: Sequence[str] | None = None) -> tuple[Spec, argparse.Namespace]:
    """Parse overrides of the default :class:`Spec` (arm values, labels, measures, image)."""
    base = Spec()
    parser = argparse.ArgumentParser(prog="python -m deploy.generator", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed files differ")
    parser.add_argument("--segment-labels", type=_labels, default=base.segment_labels)
    parser.add_argument("--arm-label", default=base.arm_label)
    parser.add_argument("--control", default=base.control, help="control arm label value")
    parser.add_argument("--treatment", default=base.treatment, help="treatment arm label value")
    parser.add_argument("--arm-scoped-labels", type=_labels, default=base.arm_scoped_labels)
    parser.add_argument("--measures", type=_labels, default=base.measures)
    parser.add_argument("--image", default=base.image)
    parser.add_argument("--namespace", default=base.namespace)
    parser.add_argument(
        "--out",
        type=Path,
        default=DEPLOY_DIR,
        help="where the files go (default: the committed deploy/, for the default spec only)",
    )
    args = parser.parse_args(argv)
    spec = replace(
        base,
        segment_labels=args.segment_labels,
        arm_label=args.arm_label,
        control=args.control,
        treatment=args.treatment,
        arm_scoped_labels=args.arm_scoped_labels,
        measures=args.measures,
        image=args.image,
        namespace=args.namespace,
    )
    return spec, args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        spec, args = build_spec(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out: Path = args.out
    if spec != Spec() and out.resolve() == DEPLOY_DIR:
        # the committed files are the default spec's, checked by the tests: another spec
        # written over them dirties the checkout and fails those checks
        print(
            "error: the files under deploy/ are rendered from the default spec "
            "(deploy/generator/spec.py) and the tests check them against it; name a directory "
            "for this spec's files with --out DIR (e.g. --out out/deploy, ignored by git)",
            file=sys.stderr,
        )
        return 2
    files = render_all(spec)
    stale = [name for name, text in files.items() if _read(out / name) != text]
    if args.check:
        for name in stale:
            print(f"out of date: {name} (run python -m deploy.generator)", file=sys.stderr)
        return 1 if stale else 0
    for name in stale:
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[name], encoding="utf-8")
        print(f"wrote {name}")
    return 0


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
