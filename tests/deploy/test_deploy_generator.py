"""The generated files are committed; they must equal what the generator renders now."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from deploy_support import DEPLOY, REPO

from deploy.generator import render
from deploy.generator.__main__ import main
from deploy.generator.spec import Spec


def test_committed_files_equal_a_fresh_render() -> None:
    files = render.render_all(Spec())
    stale = [
        name for name, text in files.items() if (DEPLOY / name).read_text(encoding="utf-8") != text
    ]
    assert stale == [], f"run `python -m deploy.generator`; out of date: {stale}"


def test_check_mode_detects_drift(tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    assert main(["--out", str(out)]) == 0
    assert main(["--out", str(out), "--check"]) == 0
    rules = out / render.ALERT_RULES
    rules.write_text(rules.read_text() + "# hand edit\n")
    assert main(["--out", str(out), "--check"]) == 1
    (out / render.DASHBOARD).unlink()
    assert main(["--out", str(out), "--check"]) == 1


def test_runs_as_a_module_from_the_repository_root() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "deploy.generator", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def test_prometheus_rule_embeds_the_rule_files_exactly() -> None:
    manifest = yaml.safe_load((DEPLOY / "k8s/prometheusrule.yaml").read_text())
    groups = []
    for name in (render.RECORDING_RULES, render.ALERT_RULES):
        groups += yaml.safe_load((DEPLOY / name).read_text())["groups"]
    assert manifest["kind"] == "PrometheusRule"
    assert manifest["spec"]["groups"] == groups


def test_dashboard_configmap_embeds_the_dashboard_verbatim() -> None:
    manifest = yaml.safe_load((DEPLOY / "k8s/dashboard-configmap.yaml").read_text())
    text = (DEPLOY / render.DASHBOARD).read_text()
    assert manifest["data"] == {"evald.json": text}
    json.loads(manifest["data"]["evald.json"])


def test_arm_values_are_overridable(tmp_path: Path) -> None:
    spec = replace(Spec(), control="A", treatment="B")
    files = render.render_all(spec)
    recording = files[render.RECORDING_RULES]
    assert 'arm="B"' in recording and 'arm="A"' in recording
    assert 'arm="treatment"' not in recording
    dashboard = files[render.DASHBOARD]
    assert "B ci95 upper" in dashboard and "treatment ci95 upper" not in dashboard


def test_the_cli_passes_overrides_through(tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    assert main(["--out", str(out), "--control", "base", "--treatment", "cand"]) == 0
    # the arm comparison's series come from evald's own comparison config; the arm values reach
    # the recording rules (the treatment/control ratio), the alert texts and the dashboard
    recording = (out / render.RECORDING_RULES).read_text()
    assert 'arm="cand"' in recording and 'arm="base"' in recording
    assert "below base by more than the minimum effect" in (out / render.ALERT_RULES).read_text()
    assert '"/^cand( |$)/"' in (out / render.DASHBOARD).read_text()


def test_overrides_never_rewrite_the_committed_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--control baseline --treatment candidate` without `--out` once rewrote deploy/ in place:
    a dirty checkout whose manifests no longer matched the tests. It now exits 2 and names
    --out; with --out the files go there. (deploy/ stands in as a copy: a failure here must
    not dirty the checkout.)"""
    import deploy.generator.__main__ as cli

    committed = tmp_path / "deploy"
    assert main(["--out", str(committed)]) == 0
    monkeypatch.setattr(cli, "DEPLOY_DIR", committed.resolve())
    before = {p: p.read_bytes() for p in committed.rglob("*") if p.is_file()}
    capsys.readouterr()
    for argv in (["--control", "baseline", "--treatment", "candidate"], ["--measures", "RR"]):
        assert main(argv) == 2
        assert main([*argv, "--check"]) == 2
        assert main([*argv, "--out", str(committed)]) == 2
        assert "--out DIR" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in committed.rglob("*") if p.is_file()} == before
    assert main([]) == 0 and main(["--check"]) == 0  # the default spec: the committed files
    mine = tmp_path / "mine"
    assert main(["--control", "baseline", "--treatment", "candidate", "--out", str(mine)]) == 0
    assert 'arm="candidate"' in (mine / render.RECORDING_RULES).read_text()
    assert sorted(p.relative_to(mine) for p in mine.rglob("*") if p.is_file()) == sorted(
        p.relative_to(committed) for p in before
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"arm_label": "variant"},  # not a segment label
        {"arm_scoped_labels": ("arm",)},
        {"arm_scoped_labels": ("locale",)},
        {"control": "x", "treatment": "x"},
    ],
)
def test_inconsistent_specs_are_refused(changes: dict) -> None:
    with pytest.raises(ValueError):
        replace(Spec(), **changes)


def test_bad_overrides_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--control", "same", "--treatment", "same", "--check"]) == 2
    assert "differ" in capsys.readouterr().err


def test_comparison_labels_drop_arm_and_arm_scoped_labels() -> None:
    assert Spec().comparison_labels == ("surface",)
    spec = replace(Spec(), segment_labels=("model", "arm", "surface", "locale"))
    assert spec.comparison_labels == ("surface", "locale")


def test_spec_defaults_agree_with_evald_defaults() -> None:
    """The deployment assumes evald's defaults; if the package changes them, so must the spec."""
    from evald.cli import build_parser
    from evald.config import EngineConfig
    from evald.daemon.settings import DaemonSettings
    from evald.demo.simulator import ARMS
    from evald.metrics import DEFAULT_MEASURES, parse_measures
    from evald.stats import Z95

    spec = Spec()
    assert spec.measures == tuple(DEFAULT_MEASURES.split(","))
    assert [str(m) for m in parse_measures(list(spec.measures))] == list(spec.measures)
    assert spec.segment_labels == tuple(EngineConfig().label_keys)
    assert (spec.control, spec.treatment) == tuple(arm for arm, _model in ARMS)
    assert spec.thresholds.ci_z == Z95  # the dashboard band equals evald's own ci95 half-width
    # the family-wise rate the alert states is the one evald's sequences run at
    assert spec.thresholds.family_alpha == EngineConfig().statistics.alpha
    assert spec.thresholds.srm_alpha == EngineConfig().statistics.srm_alpha
    assert DaemonSettings().metrics_address.endswith(f":{spec.metrics_port}")
    demo_args = build_parser().parse_args(["demo"])
    assert demo_args.metrics_address.endswith(f":{spec.metrics_port}")
