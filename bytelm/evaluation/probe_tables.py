"""The probes section of a report (Markdown tables) from a probe record
(:func:`bytelm.evaluation.probes.probe_runs`)."""

from __future__ import annotations

from bytelm.evaluation.noise import NOISES
from bytelm.evaluation.probes import EDITS, FREQUENT
from bytelm.evaluation.report import table


def _cell(x, ci=None, digits: int = 3) -> str:
    if x is None:
        return "-"
    text = f"{x:.{digits}f}"
    if ci and ci[0] is not None:
        text += f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
    return text


def probe_lines(probes: dict | None) -> list[str]:
    """The probes section of a report (Markdown): the summary table, per noise, per edit kind and
    band, per group; or the line saying why there is none."""
    if not probes:
        return []
    if probes.get("skipped"):
        return ["## Probes", "", f"No probes: {probes['skipped']}.", ""]
    s = probes["settings"]
    models = probes["models"]
    lines = [
        "## Probes",
        "",
        f"Probe set `{probes['fingerprint'][:16]}` (version {probes['version']}, seed {s['seed']}): "
        f"{probes['choice_items']} continuation items (contexts of {s['context_bytes']} bytes, four "
        f"continuations of {s['continuation_chars']} characters) and {probes['spelling_items']} spelling "
        'pairs, from the held-out segments (docs/evaluation.md, "Probes"). 95% intervals: cluster '
        "bootstrap over the items' documents. Chance: 0.25 (choice), 0.5 (spelling).",
        "",
    ]
    if probes.get("cross_group_items"):
        lines += [
            f"{probes['cross_group_items']} of the {probes['choice_items']} continuation items draw their "
            "distractors from other groups (their own had fewer than three other held-out documents): "
            "another language's script or another package's style makes them easier than the rest.",
            "",
        ]
    rows = []
    for name, f in models.items():
        c, sp = f.get("choice", {}), f.get("spelling", {})
        rows.append(
            [
                name,
                _cell(c.get("accuracy"), c.get("accuracy_ci95")),
                _cell(c.get("noised_accuracy"), c.get("noised_accuracy_ci95")),
                _cell(c.get("robustness"), c.get("robustness_ci95"), 1),
                _cell(c.get("bpb_no_context"), None),
                _cell(c.get("bpb_clean_context"), c.get("bpb_clean_context_ci95")),
                _cell(c.get("R"), None, 1),
                _cell(sp.get("accuracy"), sp.get("accuracy_ci95")),
            ]
        )
    lines += [
        table(
            [
                "model",
                "choice accuracy",
                "noised accuracy (mean of 5)",
                "robustness (H-Net)",
                "cont. BPB, no context",
                "cont. BPB, clean context",
                "R (mean of 5)",
                "spelling accuracy",
            ],
            rows,
            "lrrrrrrr",
        ),
        "",
    ]
    rows = []
    for name, f in models.items():
        noise_rows = f.get("choice", {}).get("noise", {})
        rows.append(
            [name]
            + [
                f"{_cell(v['accuracy'])} / {_cell(v['bpb'])} / {_cell(v['R'], v['R_ci95'], 1)}"
                for v in (noise_rows.get(k) for k in NOISES)
                if v is not None
            ]
        )
    any_model: dict = next(iter(models.values()), {})
    first = any_model.get("choice", {}).get("noise", {})
    unchanged = ", ".join(f"{k} {v['unchanged']}" for k, v in first.items() if v["unchanged"])
    cut = ", ".join(f"{k} {v['truncated']}" for k, v in first.items() if v["truncated"])
    lines += [
        "Per noise: accuracy / BPB of the true continuation given the noised context / R [95% interval]:",
        "",
        table(["model", *NOISES], rows),
        "",
        f"Noised contexts equal to the clean one (a noise that changes nothing, e.g. case on a script "
        f"without case): {unchanged or 'none'}; cut from the left to fit: {cut or 'none'}.",
        "",
    ]
    rows = []
    for name, f in models.items():
        sp = f.get("spelling", {})
        cells = [_cell(sp.get("by_edit", {}).get(e, {}).get("accuracy")) for e in EDITS]
        cells += [_cell(sp.get("by_band", {}).get(b, {}).get("accuracy")) for b in ("frequent", "rare")]
        rows.append([name, *cells])
    first_sp = any_model.get("spelling", {})
    counts = {
        **{e: first_sp.get("by_edit", {}).get(e, {}).get("items", 0) for e in EDITS},
        **{b: first_sp.get("by_band", {}).get(b, {}).get("items", 0) for b in ("frequent", "rare")},
    }
    lines += [
        f"Spelling accuracy per edit kind and per word band (frequent: seen at least {FREQUENT} times in a "
        "sample of the training documents):",
        "",
        table(["model", *[f"{k} ({n})" for k, n in counts.items()]], rows),
        "",
    ]
    groups = sorted(
        {g for f in models.values() for g in f.get("choice", {}).get("groups", {})},
        key=lambda g: -next(iter(models.values()))["choice"]["groups"].get(g, {}).get("items", 0),
    )[:20]
    if len(groups) > 1:
        rows = []
        for g in groups:
            first_g = next(iter(models.values()))["choice"]["groups"].get(g, {})
            first_s = next(iter(models.values())).get("spelling", {}).get("groups", {}).get(g, {})
            cells = [g, f"{first_g.get('items', 0)} / {first_s.get('items', 0)}"]
            for f in models.values():
                parts = [
                    (f.get("choice", {}).get("groups", {}).get(g) or {}).get("accuracy"),
                    (f.get("choice", {}).get("noised_groups", {}).get(g) or {}).get("accuracy"),
                    (f.get("spelling", {}).get("groups", {}).get(g) or {}).get("accuracy"),
                ]
                cells.append(" / ".join(_cell(x) for x in parts))
            rows.append(cells)
        lines += [
            "Per group: continuation choice clean / noised (mean of the 5 noises) / spelling accuracy "
            "(intervals in the JSON record):",
            "",
            table(["group", "items (choice / spelling)", *models], rows),
            "",
        ]
    return lines
