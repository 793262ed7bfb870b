import re

import pytest

from include.config import ClickLogConfig, ConfigError, SolarisConfig, load_config


def test_defaults_run_the_embedded_setup():
    cfg = load_config(env={})
    assert cfg.spark.master == "local[*]"
    assert cfg.lake.database == "solaris"
    assert cfg.lake.table_path("request_log").name == "request_log"
    assert cfg.clicklog.negatives_per_click == 9


def test_toml_overrides_and_env_wins(tmp_path):
    f = tmp_path / "solaris.toml"
    f.write_text('[lake]\nroot = "/data/lake"\n[clicklog]\nnegatives_per_click = 4\n[spark.extra]\n"spark.executor.memory" = "8g"\n')
    cfg = load_config(f, env={"SOLARIS_SPARK_MASTER": "spark://10.0.0.1:7077"})
    assert cfg.lake.root == "/data/lake"
    assert cfg.clicklog.negatives_per_click == 4
    assert cfg.clicklog.min_pool_clicks == ClickLogConfig().min_pool_clicks  # untouched default
    assert cfg.spark.master == "spark://10.0.0.1:7077"
    assert cfg.spark.extra == {"spark.executor.memory": "8g"}
    assert load_config(f, env={"SOLARIS_LAKE_ROOT": "/x"}).lake.root == "/x"
    # SOLARIS_SPARK_CONF adds Spark properties to the file's, and wins where both name one.
    conf = "spark.executor.memory=4g  spark.sql.ui.explainMode=simple\n"
    assert load_config(f, env={"SOLARIS_SPARK_CONF": conf}).spark.extra == {
        "spark.executor.memory": "4g", "spark.sql.ui.explainMode": "simple"}


@pytest.mark.parametrize("conf", ["spark.sql.ui.explainMode", "explainMode=simple", "spark.x="])
def test_spark_conf_from_the_environment_must_be_spark_properties(conf):
    with pytest.raises(ConfigError, match=re.escape(f"SOLARIS_SPARK_CONF: {conf!r} is not spark.<name>=<value>")):
        load_config(env={"SOLARIS_SPARK_CONF": conf})


@pytest.mark.parametrize("text, message", [
    ("[lake]\nrot = 'x'\n", "unknown config key(s) in [lake]: rot"),
    ("[lakes]\nroot = 'x'\n", "unknown config key(s) in [root]: lakes"),
    ("[clicklog]\nnegatives_per_click = 'nine'\n", "clicklog.negatives_per_click must be int"),
    ("[clicklog]\nseed = true\n", "clicklog.seed must be int, got a boolean"),
    ("[lake\n", "not valid TOML"),
])
def test_bad_config_is_a_clear_error(tmp_path, text, message):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(f, env={})


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml", env={})


def test_with_overrides_keeps_other_fields():
    cfg = SolarisConfig().with_overrides(lake={"database": "x"})
    assert cfg.lake.database == "x" and cfg.lake.root == "lake"
