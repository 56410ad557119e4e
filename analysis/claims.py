"""The report's first table: each claim of the paper and of ours, its verdict by rule, test, setting, runs and compute.

Every verdict comes from ``analysis.verdicts`` applied to numbers measured here; nothing is worded per result. The
accuracy claims pair the two models: by seed when the study ran several (a paired t interval), else on the test
images, each answered by both models' final checkpoints (McNemar's exact test and an Agresti-Min interval): the
runs log no per-image answers, so the analysis recomputes them from the checkpoints it downloads anyway, and checks
each model's recomputed accuracy against the one its run logged (a mismatch is named under the table). Margins are
stated in the claim's row; a claim whose models were not run, or not usable, reads "cannot tell at this scale".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from analysis import verdicts as v
from analysis.beyond_paper import GATE, GATE_INIT, STAYED, content_variants
from analysis.compute import fmt_seconds, total
from analysis.gaussian_locality import gaussian_locality
from analysis.runs import LoadedRun, LoadedStudy
from analysis.variants import Variant
from pipeline.models.conv_to_attention import theorem_error_vs_alpha
from pipeline.sweep.manifest import FINISHED
from pipeline.sweep.tracking import ui

QUADRATIC, GENERALIZED, LEARNED = "sa_quadratic_9", "sa_generalized_9", "sa_learned_9"
PRUNED = GENERALIZED + "_pruned"
EQUIVALENCE_MARGIN = 0.01  # "as accurate as" / "keeps the accuracy": within 1 point (the paper: 93.8 vs 93.8)
NOT_BETTER_MARGIN = 0.01  # "no better than": a gain of 1 point or more excluded (the paper: 93.4 vs 93.8)
LEARNED_GAP = 0.02  # the paper: 91.8 vs 93.8
PRUNE_REDUCTION = 0.2  # "about a fourth fewer": the paper's 12.1M -> 9.7M params (-20 %), 6.2B -> 4.9B FLOPs (-21 %)
DISTINCT_GAIN = 3  # layer 1 gains at least 3 sharp heads on distinct shifts (a third of a 3x3 kernel's taps)
THEOREM_ALPHA, THEOREM_TOLERANCE = 100.0, 1e-4  # largest |attention - convolution| at that softmax width
REBUILD_TOLERANCE = 1e-9  # the rebuilt ResNet18's largest logit difference in float64 (what the stage checks)
UI_BASE = "http://127.0.0.1:5000"  # `make ui`'s address for a local store; an http tracking URI is its own
COLUMNS = ["claim", "by", "verdict", "statistic", "test", "setting", "runs", "compute"]


@dataclass
class Claim:
    claim: str
    by: str  # "paper" | "ours"
    verdict: str
    statistic: str
    test: str
    setting: str
    runs: list[LoadedRun] = field(default_factory=list)


@dataclass
class Evidence:
    """What the claims are measured from: the study, its variants, each Gaussian run's finding summary, the test
    images (normalised) and labels, the tables folder (CKA matrices) and the setting."""

    study: LoadedStudy
    variants: Sequence[Variant]
    setting: Mapping[str, Any]
    images: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    tables: Path | None = None
    notes: list[str] = field(default_factory=list)
    _answers: dict[str, np.ndarray | None] = field(default_factory=dict)

    def finished(self, variant: str) -> dict[int, LoadedRun]:
        """Seed -> the variant's run that finished with a final accuracy and a model (loaded on first use)."""
        runs = [*self.study.runs, *self.study.transformed]
        return {
            r.seed: r
            for r in runs
            if r.variant == variant and r.status == FINISHED and math.isfinite(r.test_acc) and r.has_model
        }

    def answers(self, run: LoadedRun) -> np.ndarray | None:
        """Per test image, whether ``run``'s final model answers it right (None without the test set)."""
        if run.run_id in self._answers:
            return self._answers[run.run_id]
        correct = None
        if self.images is not None and self.labels is not None and run.model is not None:
            correct = per_image_correct(run.model, self.images, self.labels)
            if abs(correct.mean() - run.test_acc) > 0.5 / len(correct):
                self.notes.append(
                    f"{run.variant} seed {run.seed}: its checkpoint answers {correct.mean():.4f} of the test images, "
                    f"its run logged {run.test_acc:.4f}"
                )
        self._answers[str(run.run_id)] = correct
        return correct


def per_image_correct(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
    """Whether ``model`` (eval mode, float32) classifies each of ``images`` (normalised) as ``labels`` says."""
    model.eval()
    with torch.no_grad():
        predicted = torch.cat([model(images[i : i + 500]).argmax(dim=1) for i in range(0, len(images), 500)])
    return (predicted == labels).numpy()


def accuracy_difference(ev: Evidence, a: str, b: str) -> tuple[v.Interval, list[LoadedRun]]:
    """Final test accuracy of ``a`` minus ``b``: paired by seed across seeds, or on the test images with one."""
    runs_a, runs_b = ev.finished(a), ev.finished(b)
    seeds = sorted(set(runs_a) & set(runs_b))
    used = [r for s in seeds for r in (runs_a[s], runs_b[s])]
    if len(seeds) >= 2:
        return v.paired_seeds([runs_a[s].test_acc for s in seeds], [runs_b[s].test_acc for s in seeds]), used
    if len(seeds) == 1:
        answers = ev.answers(runs_a[seeds[0]]), ev.answers(runs_b[seeds[0]])
        if answers[0] is not None and answers[1] is not None:
            return v.paired_images(*answers), used
    missing = [name for name, runs in ((a, runs_a), (b, runs_b)) if not runs]
    why = f"no finished run of {', '.join(missing)}" if missing else "one seed and no test set to pair on"
    return v.Interval(math.nan, math.nan, math.nan, why), used


def fmt_points(diff: v.Interval) -> str:
    if not diff.finite:
        return diff.test if diff.test != "not measured" else "not measured"
    p = f", p = {diff.p_value:.2g}" if math.isfinite(diff.p_value) else ""
    return f"{100 * diff.estimate:+.2f} points [95 % CI {100 * diff.low:+.2f}, {100 * diff.high:+.2f}]{p}"


def setting_text(setting: Mapping[str, Any], runs: Sequence[LoadedRun]) -> str:
    seeds = sorted({r.seed for r in runs})
    epochs = sorted({int(r.epochs) for r in runs if math.isfinite(r.epochs)})
    images = f", {setting['test images']} test images" if setting.get("test images") else ""
    return (
        f"{setting.get('dataset', '?')} {setting.get('image size', '?')}{images}, "
        f"{'/'.join(map(str, epochs)) or '?'} epochs, seeds {', '.join(map(str, seeds)) or 'none'}"
    )


def _accuracy_claims(ev: Evidence, baseline: str | None) -> list[Claim]:
    claims = []
    reference = baseline or "resnet18"
    diff, runs = accuracy_difference(ev, QUADRATIC, reference)
    claims.append(
        Claim(
            f"SA quadratic is as accurate as ResNet18 (margin ±{100 * EQUIVALENCE_MARGIN:g} point)",
            "paper",
            v.equivalent(diff, EQUIVALENCE_MARGIN),
            "SA quadratic - ResNet18: " + fmt_points(diff),
            f"{diff.test}; equivalence: the 95 % CI inside ±{100 * EQUIVALENCE_MARGIN:g} point",
            setting_text(ev.setting, runs),
            runs,
        )
    )
    diff, runs = accuracy_difference(ev, QUADRATIC, LEARNED)
    claims.append(
        Claim(
            f"The learned encoding is about {100 * LEARNED_GAP:g} points less accurate than the quadratic",
            "paper",
            v.lower_by_about(diff, LEARNED_GAP),
            "SA quadratic - SA learned: " + fmt_points(diff),
            f"{diff.test}; holds: CI above 0; does not hold: CI below {50 * LEARNED_GAP:g} point (half the gap)",
            setting_text(ev.setting, runs),
            runs,
        )
    )
    diff, runs = accuracy_difference(ev, GENERALIZED, QUADRATIC)
    claims.append(
        Claim(
            "The generalized encoding is no better than the quadratic",
            "paper",
            v.not_better(diff, NOT_BETTER_MARGIN),
            "SA generalized - SA quadratic: " + fmt_points(diff),
            f"{diff.test}; holds: CI below +{100 * NOT_BETTER_MARGIN:g} point; does not hold: CI above 0",
            setting_text(ev.setting, runs),
            runs,
        )
    )
    return claims


def _pruning_claim(ev: Evidence) -> Claim:
    diff, runs = accuracy_difference(ev, PRUNED, GENERALIZED)
    pruned, source = ev.finished(PRUNED), ev.finished(GENERALIZED)
    seeds = sorted(set(pruned) & set(source))
    ratios = {
        kind: v.mean_interval([1 - getattr(pruned[s], kind) / getattr(source[s], kind) for s in seeds])
        for kind in ("n_params", "flops_paper")
    }
    verdict = v.all_of(
        v.equivalent(diff, EQUIVALENCE_MARGIN), *(v.at_least(r, PRUNE_REDUCTION) for r in ratios.values())
    )
    fewer = ", ".join(
        f"{name} {100 * r.estimate:.0f} % fewer" if math.isfinite(r.estimate) else f"{name} not measured"
        for name, r in zip(("params", "FLOPs (paper convention)"), ratios.values(), strict=True)
    )
    epochs = sorted({int(r.epochs) for r in pruned.values() if math.isfinite(r.epochs)})
    return Claim(
        f"Pruning the degenerate heads and fine-tuning keeps the accuracy (±{100 * EQUIVALENCE_MARGIN:g} point) "
        f"with at least {100 * PRUNE_REDUCTION:g} % fewer params and FLOPs",
        "paper",
        verdict,
        f"pruned - unpruned generalized: {fmt_points(diff)}; {fewer}",
        f"{diff.test}; equivalence within ±{100 * EQUIVALENCE_MARGIN:g} point, and both reductions at least "
        f"{100 * PRUNE_REDUCTION:g} %",
        setting_text(ev.setting, runs) + (f"; fine-tuned {'/'.join(map(str, epochs))} epochs" if epochs else ""),
        runs,
    )


def _layer_measure(run: LoadedRun, layer: int) -> np.ndarray:
    """Each non-degenerate head's Gaussian attention distance in ``layer`` at the end of training (own Gaussian)."""
    heads = run.head_history[-1]["layers"][layer]
    return gaussian_locality(heads["centres"], heads["sigma_inv"])["distance"]


def _finding_claims(ev: Evidence, summaries: Mapping[str, pd.DataFrame], variant: str) -> list[Claim]:
    runs = [r for r in ev.finished(variant).values() if r.head_history and r.run_id in summaries]
    gains = [
        float(
            summaries[r.run_id].iloc[0].heads_at_distinct_shifts
            - summaries[r.run_id].iloc[0].heads_at_distinct_shifts_init
        )
        for r in runs
    ]
    gain = v.mean_interval(gains)
    shifts = Claim(
        "The first layer's quadratic heads move to distinct shifts around the query (a kernel's taps)",
        "paper",
        v.at_least(gain, DISTINCT_GAIN),
        "layer 1: sharp heads on distinct shifts, gained from init: "
        + (f"{gain.estimate:.1f} [{gain.low:.1f}, {gain.high:.1f}]" if gain.finite else "not measured"),
        f"{gain.test}; holds: at least {DISTINCT_GAIN} gained",
        setting_text(ev.setting, runs),
        runs,
    )
    first = [_layer_measure(r, 0) for r in runs]
    last = [_layer_measure(r, -1) for r in runs]
    if runs and min(len(r.head_history[-1]["layers"]) for r in runs) < 2:
        wider = v.Interval(math.nan, math.nan, math.nan, "one layer: no depth to compare")
        verdict, statistic = v.CANNOT_TELL, "not measured"
    elif len(runs) >= 2:
        wider = v.paired_seeds([np.nanmean(x) for x in last], [np.nanmean(x) for x in first])
        verdict = v.positive(wider)
        statistic = (
            f"last - first layer's mean attention distance: {wider.estimate:+.2f} tokens "
            f"[{wider.low:+.2f}, {wider.high:+.2f}]"
        )
    else:
        wider = v.mann_whitney_less(first[0], last[0]) if runs else v.NOT_MEASURED
        verdict = v.significant_order(wider)
        statistic = (
            f"median attention distance, last - first layer: {wider.estimate:+.2f} tokens, p = {wider.p_value:.2g}"
            if math.isfinite(wider.estimate)
            else "not measured"
        )
    deeper = Claim(
        "Deeper layers attend wider than the first",
        "paper",
        verdict,
        statistic,
        wider.test + " (each head's own Gaussian, degenerate heads left out)",
        setting_text(ev.setting, runs),
        runs,
    )
    return [shifts, deeper]


def _gates_claim(ev: Evidence) -> Claim | None:
    gated = [x.name for x in content_variants(ev.variants)]
    runs = [r for name in gated for r in ev.finished(name).values() if r.locality_history]
    runs = [r for r in runs if GATE in r.locality_history[-1]["layers"][0]]
    if not gated:
        return None
    gates = [[np.asarray(layer[GATE]) for layer in r.locality_history[-1]["layers"]] for r in runs]
    moved = max((float(np.abs(np.concatenate(g) - GATE_INIT).max()) for g in gates), default=math.nan)
    if len(runs) >= 2:
        test = v.paired_seeds([g[0].mean() for g in gates], [g[-1].mean() for g in gates])
        verdict = v.positive(test)
    else:
        test = v.mann_whitney_less(gates[0][-1], gates[0][0]) if runs else v.NOT_MEASURED
        verdict = v.significant_order(test)
    if math.isfinite(moved) and moved < STAYED:
        verdict = v.CANNOT_TELL  # the gates never trained: no order to read
    statistic = (
        f"first - last layer's gate: {test.estimate:+.3f}"
        + (f", p = {test.p_value:.2g}" if math.isfinite(test.p_value) else "")
        + f"; largest move from init {moved:.3f}"
        if math.isfinite(test.estimate)
        else "not measured"
    )
    return Claim(
        "GPSA: the last layer's gates fall below the first's (ConViT: late layers turn to content)",
        "ours",
        verdict,
        statistic,
        test.test + f"; cannot tell when no gate moved {STAYED:g} from its init",
        setting_text(ev.setting, runs),
        runs,
    )


def _cka_claim(ev: Evidence, variant: str) -> Claim:
    path = ev.tables / f"cka_{variant}.csv" if ev.tables is not None else None
    runs = sorted(ev.finished(variant).values(), key=lambda r: r.seed)[:1]
    baseline = [r for r in ev.finished("resnet18").values() if runs and r.seed == runs[0].seed]
    if path is None or not path.is_file():
        order = v.NOT_MEASURED
    else:
        matrix = pd.read_csv(path, index_col=0).dropna()  # a layer without a finite CKA has no most similar stage
        order = v.spearman([float(matrix.columns.get_loc(matrix.loc[row].idxmax())) for row in matrix.index])
    statistic = (
        f"rho = {order.estimate:.2f}, p = {order.p_value:.2g}" if math.isfinite(order.estimate) else "not measured"
    )
    return Claim(
        "CKA: deeper attention layers are most like deeper ResNet18 stages",
        "ours",
        v.significant_order(order),
        statistic + " (each layer's most similar stage against the layer's depth)",
        order.test,
        setting_text(ev.setting, [*runs, *baseline]) + "; the lowest seed",
        [*runs, *baseline],
    )


def theorem_case() -> tuple[torch.nn.Conv2d, torch.Tensor]:
    """The random 3x3 convolution (3 -> 4 channels, weights N(0, 0.5^2), seed 0) and 8x8 input on which the report
    checks Theorem 1: its claim at one softmax width, its figure over many, the same case."""
    generator = torch.Generator().manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    return conv, torch.randn(1, 3, 8, 8, generator=generator)


def _theorem_claim() -> Claim:
    conv, x = theorem_case()
    error = theorem_error_vs_alpha(conv, x, [THEOREM_ALPHA])[0][1]
    return Claim(
        "Theorem 1: attention with 9 quadratic heads expresses a 3x3 convolution exactly",
        "paper",
        v.exact(error, THEOREM_TOLERANCE),
        f"largest |attention - convolution| at alpha {THEOREM_ALPHA:g}: {error:.1e}",
        f"exact construction, tolerance {THEOREM_TOLERANCE:g} (float32)",
        "a random 3x3 convolution, 3 -> 4 channels, one 8x8 input; no training",
    )


def _rebuild_claim(ev: Evidence) -> Claim | None:
    manifest = ev.study.transform
    if manifest is None:
        return None
    models = manifest.models
    worst = max((m.max_logit_diff_float64 for m in models), default=math.nan)
    same = all(m.test_acc_step0 == m.source_test_acc for m in models)
    verdict = v.all_of(v.exact(worst, REBUILD_TOLERANCE), v.HOLDS if same and models else v.CANNOT_TELL)
    runs = [r for r in ev.study.transformed if r.run_id]
    return Claim(
        "The trained ResNet18 rebuilt as attention equals it before training",
        "ours",
        verdict,
        f"largest logit difference, float64: {worst:.1e}; same test accuracy in float32: {'yes' if same else 'no'}",
        f"exact construction on the whole test set, tolerance {REBUILD_TOLERANCE:g}",
        setting_text(ev.setting, runs),
        runs,
    )


def claims(ev: Evidence, summaries: Mapping[str, pd.DataFrame], baseline: str | None, fig2: str | None) -> list[Claim]:
    """Every claim the study can speak to, in the paper's order, then ours."""
    found = [_theorem_claim(), *_accuracy_claims(ev, baseline)]
    found += _finding_claims(ev, summaries, fig2 or QUADRATIC)
    found.append(_pruning_claim(ev))
    found += [c for c in (_rebuild_claim(ev), _gates_claim(ev)) if c is not None]
    found.append(_cka_claim(ev, fig2 or QUADRATIC))
    return found


def claims_table(found: Sequence[Claim], compute: pd.DataFrame, link: Callable[[list[str]], str]) -> pd.DataFrame:
    """The report's table: one row per claim, its runs as a UI link and their device-seconds."""
    rows = []
    for c in found:
        ids = [r.run_id for r in c.runs if r.run_id]
        seconds, _ = total(compute, ids)
        rows.append(
            {
                "claim": c.claim,
                "by": c.by,
                "verdict": f"**{c.verdict}**",
                "statistic": c.statistic,
                "test": c.test,
                "setting": c.setting,
                "runs": f"[{len(ids)} run{'s' * (len(ids) > 1)}]({link(ids)})" if ids else "none",
                "compute": fmt_seconds(seconds) if ids else "none (computed by the analysis)",
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def run_link(study: LoadedStudy) -> Callable[[list[str]], str]:
    """The MLflow UI page of some of the study's runs: its server, or `make ui`'s address for a local store."""
    uri = study.tracking_uri
    base = uri if uri.startswith(("http://", "https://")) else UI_BASE
    return lambda ids: ui.runs_url(base, study.experiment_id, ids)
