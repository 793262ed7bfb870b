"""
### solaris_train (daily)

Retrains the FM, the autoencoder and every consumer's VM variants (`[[models.consumers]]` in the
config: a click VM by default; conversion and per-surface VMs as declared, each `vm_<name>`) on what
the lake holds (`model.training.train_all`: time-ordered 70/15/15 split, on the GPU when there is
one), writes the evaluation report beside the lake, then trains each consumer's VM + SOLARIS
(`vm_<name>_solaris`) on the features the lookup **served** in the last `[models]
served_window_hours` (`request_features`; `model/served_training.py`), or logs that its plain VM
keeps serving it while fewer than `served_min_rows` were served, then **gates** each new version (`model/promotion.py`): it is
promoted only if it is not worse than the promoted version on its held-out split (lower NE; lower
reconstruction MSE for the autoencoder; `tolerance` param, default 0). Every decision is logged
with both numbers. Precompute runs promoted models when its config says `"promoted"`. A lake whose
click-log candidates failed the ingest's leak check fails the run with the finding (no retry), unless
`[quality] allow_leaking_candidates`.

**Rollout.** A new FM or autoencoder is a new code space (`model.registry.CodeSpaces`): the
hourly cycle keeps serving the space the consumers' promoted SOLARIS VMs read and writes the new
one beside it in shadow (`shadow_request_features`); this DAG trains the consumers on the new
space once its shadow rows reach `served_min_rows`, and the first publication after their
promotion serves it. Trigger with `retrain: consumers` to retrain only the consumers (finish a
rollout without training another FM).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import CronDataIntervalTimetable, Param, dag, task

from include.orchestration import DEFAULT_ARGS


@task
def train(sizes: str, retrain: str) -> dict:
    from pathlib import Path

    from include.config import load_config
    from model import training

    from airflow.sdk.exceptions import AirflowFailException
    from model.data import LeakingCandidates

    cfg = load_config()
    if retrain == "consumers":
        print("retrain=consumers: the FM, the autoencoder and the plain VMs are kept as they are")
        return {}
    try:
        result = training.train_all(cfg, None, training.model_set(sizes))
    except LeakingCandidates as e:  # a retry would refuse again: fail once, with the reason
        raise AirflowFailException(str(e)) from None
    training.write_report(result, cfg.lake.root_path / "reports")
    print(training.to_markdown(result))
    return {k: str(Path(v)) for k, v in result["models"].items()}


@task
def train_served(saved: dict, sizes: str) -> dict:
    """Every consumer's VM + SOLARIS on the features the lookup served (model/served_training.py),
    after the day's FM, autoencoder and plain VMs: ``saved`` with the served VMs added."""
    from include.config import load_config
    from model import served_training, training

    result = served_training.train_consumers(load_config(), training.model_set(sizes))
    for d in result["decisions"]:
        print(f"{d['model']}: {'trained' if d['trained'] else 'not trained'} - {d['reason']}")
    return saved | result["models"]


@task
def promote(saved: dict, tolerance: float) -> list[dict]:
    from include.config import load_config
    from model.promotion import gate

    decisions = gate(load_config().models_root, saved, tolerance)
    for d in decisions:
        print(f"{d['model']} {d['version']}: {'PROMOTED' if d['promoted'] else 'kept ' + str(d['previous'])} - {d['reason']}")
    return decisions


@dag(
    dag_id="solaris_train",
    schedule=CronDataIntervalTimetable("0 3 * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # versions are numbered in order; two trainings at once would interleave
    default_args=DEFAULT_ARGS,
    tags=["solaris", "training", "daily"],
    doc_md=__doc__,
    render_template_as_native_obj=True,  # params reach the tasks as bool and float, not strings
    params={"sizes": Param("full", enum=["quick", "full", "tiny"],
                           description="model sizes: full; quick for smoke runs; tiny to check the DAGs in seconds"),
            "tolerance": Param(0.0, type="number", description="promote if at most this much worse"),
            "retrain": Param("all", enum=["all", "consumers"],
                             description="all models, or only the consumers' SOLARIS VMs (e.g. to finish a rollout)")},
)
def solaris_train():
    sizes = "{{ params.sizes }}"
    promote(train_served(train(sizes, "{{ params.retrain }}"), sizes), "{{ params.tolerance }}")


solaris_train()
