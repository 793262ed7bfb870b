"""No step of the hourly cycle funnels its data through one task.

Spark plans an exchange to a single partition for a window without a partition, a global sort or
an exact global quantile: every row of the step then goes through one task, which no cluster can
widen. The only single-partition exchanges allowed are those whose input is already bounded by
the number of partitions: the partial results of a global aggregate and the per-partition best k
of a top-k. The test reads the physical plan of every query one cycle ran, from Spark's own SQL
status store (what the Spark UI's SQL tab shows).
"""

import re
from datetime import datetime

import pytest

from spark_jobs import cycle
from tests.conftest import copy_lake

pytestmark = pytest.mark.spark

T = datetime(2026, 1, 5, 10, 0, 0)  # inside the synthetic log (2026-01-05 00:00 .. 12:00)
TREE_NODE = re.compile(r"^(?P<indent>[\s|:]*)(?:\+-|:-)?\s*(?:\*\s*)?(?P<name>[A-Za-z]+)[^(]*\((?P<id>\d+)\)")
BOUNDED_INPUTS = ("TakeOrderedAndProject", "LocalLimit")  # at most k rows a partition


@pytest.fixture(autouse=True)
def formatted_plans(spark):
    """The status store keeps each plan in ``spark.sql.ui.explainMode``; the suite sets it to
    ``simple`` (tests/conftest.py) and the check reads the node ids and details of ``formatted``."""
    old = spark.conf.get("spark.sql.ui.explainMode")
    spark.conf.set("spark.sql.ui.explainMode", "formatted")
    yield
    spark.conf.set("spark.sql.ui.explainMode", old)


def _node_details(description: str) -> dict[str, str]:
    """Node id -> its detail block, from a formatted physical plan."""
    blocks = re.split(r"\n(?=\(\d+\) )", description)
    return {m.group(1): b for b in blocks if (m := re.match(r"\((\d+)\) ", b))}


def unbounded_single_partition_steps(description: str) -> list[str]:
    """The single-partition exchanges of a formatted physical plan whose input is not bounded by
    the partition count, each as "Exchange <- Child (details)"."""
    details = _node_details(description)
    tree = [line for line in description.split("\n\n", 1)[0].splitlines() if TREE_NODE.match(line)]
    out = []
    for i, line in enumerate(tree):
        node = TREE_NODE.match(line)
        if node["name"] != "Exchange" or "SinglePartition" not in details.get(node["id"], ""):
            continue
        child = TREE_NODE.match(tree[i + 1]) if i + 1 < len(tree) else None
        child_details = details.get(child["id"], "") if child else ""
        partial = "Aggregate" in (child["name"] if child else "") and "partial_" in child_details \
            and "Keys: []" in child_details
        if child is None or not (partial or child["name"] in BOUNDED_INPUTS):
            out.append(f"Exchange SinglePartition <- {child['name'] if child else '?'}: {child_details[:300]}")
    return out


def executed_plans(spark, after_id: int) -> list[tuple[str, str]]:
    """(description, physical plan) of every SQL execution with an id above ``after_id``."""
    it = spark._jsparkSession.sharedState().statusStore().executionsList().iterator()
    out = []
    while it.hasNext():
        e = it.next()
        if e.executionId() > after_id:
            out.append((e.description(), e.physicalPlanDescription()))
    return out


def last_execution_id(spark) -> int:
    it = spark._jsparkSession.sharedState().statusStore().executionsList().iterator()
    last = -1
    while it.hasNext():
        last = max(last, it.next().executionId())
    return last


def test_the_check_sees_an_unpartitioned_window_and_allows_global_aggregates(spark):
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    before = last_execution_id(spark)
    df = spark.range(1000).withColumn("g", F.col("id") % 7)
    df.agg(F.percentile_approx("id", 0.5, 10_000), F.count("*")).collect()
    df.orderBy(F.desc("id")).limit(5).join(df, "id").count()
    df.withColumn("r", F.row_number().over(Window.partitionBy("g").orderBy("id"))).agg(F.max("r")).collect()
    assert [s for _, plan in executed_plans(spark, before) for s in unbounded_single_partition_steps(plan)] == []
    df.withColumn("r", F.row_number().over(Window.orderBy("id"))).agg(F.max("r")).collect()
    flagged = [plan for _, plan in executed_plans(spark, before) if unbounded_single_partition_steps(plan)]
    assert len(flagged) == 1 and "Window" in flagged[0]


def test_no_hourly_stage_moves_all_its_rows_through_one_task(spark, lake_root, base_lake):
    from tests.conftest import _test_config

    cfg = _test_config(lake_root / "plans", database="t_plans").with_overrides(
        precompute={"lookback_hours": 3, "trending_items": 5, "recent_items_per_user": 5}, models={"device": "cpu"})
    cfg = copy_lake(spark, base_lake, cfg)
    before = last_execution_id(spark)
    out = cycle.run(spark, cfg, T, record_misses=True, log=lambda *_: None)
    assert out["precompute"]["pairs_embedded"] > 0  # the cycle did its work
    plans = executed_plans(spark, before)
    assert sum(bool(_node_details(plan)) for _, plan in plans) > 10  # formatted plans, read node by node
    found = [f"{desc[:80]}: {s}" for desc, plan in plans for s in unbounded_single_partition_steps(plan)]
    assert found == [], "\n".join(found)
