import json
from importlib.resources import files
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from tapfix.proxy.config.file import Config, ConfigError, load
from tapfix.proxy.config.model import ParamPolicy

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "workstation.toml"

MINIMAL = """
[upstreams.gpu0]
base_url = "http://127.0.0.1:8000/v1"
engine = "vllm"

[models.qwen]
"""


def write(tmp_path, text):
    file = tmp_path / "tapfix.toml"
    file.write_text(text)
    return file


def error_of(tmp_path, text):
    file = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load(file)
    return str(info.value), str(file)


def test_schema_is_valid_and_packaged():
    schema = json.loads((files("tapfix.schemas") / "config.schema.json").read_text())
    Draft202012Validator.check_schema(schema)


def test_example_loads():
    c = load(EXAMPLE)
    assert set(c.upstreams) == {"gpu0", "gpu1"}
    qwen = c.models["qwen3-32b"]
    assert qwen.upstream_model == "Qwen/Qwen3-32B"
    assert qwen.aliases == ("qwen", "Qwen/Qwen3-32B")
    assert qwen.generation_config == Path("/models/Qwen3-32B")
    assert qwen.sampling["presence_penalty"] == ParamPolicy(
        "fill", 1.5, reason="config models.qwen3-32b.sampling.presence_penalty"
    )
    assert qwen.sampling["top_p"].max == 0.95 and qwen.sampling["top_p"].mode == "fill"
    assert qwen.reasoning.dialect == "vllm" and qwen.reasoning.template_var == "enable_thinking"
    glm = c.models["glm-5.2"]
    assert glm.reasoning.levels == ("none", "high", "max")
    assert glm.reasoning.budgets == {"high": 16384, "max": 32768}
    assert c.upstreams["gpu0"].api_key_env == "GPU0_API_KEY"
    assert c.upstreams["gpu0"].style == "openai"
    assert c.reasoning_field.for_user_agent("opencode/1.18.33 ai-sdk/provider-utils") == "reasoning_content"
    assert c.reasoning_field.for_user_agent("omp/18.2.3") is None
    assert c.probe == {"interval": 300}
    assert c.run_settings["db"] == str(EXAMPLE.parent / "../captures/tapfix.db")
    assert not c.is_quick


def test_minimal_defaults(tmp_path):
    c = load(write(tmp_path, MINIMAL))
    m = c.models["qwen"]
    assert (m.upstream, m.upstream_model, m.aliases) == ("gpu0", "qwen", ())
    assert c.run_settings == {} and c.strict is False  # the file gives no run setting: the flags' defaults hold
    assert c.upstreams["gpu0"].base_url == "http://127.0.0.1:8000/v1"
    fleet = load(write(tmp_path, 'db = "postgresql://tapfix@db.internal/tapfix"\n' + MINIMAL))
    assert (
        fleet.run_settings["db"] == "postgresql://tapfix@db.internal/tapfix"
    )  # a URL stays a URL, not a path under the config's folder


def test_anthropic_engine_sends_x_api_key_by_default(tmp_path):
    c = load(write(tmp_path, MINIMAL.replace('"vllm"', '"anthropic"')))
    assert c.upstreams["gpu0"].style == "anthropic"
    assert c.models["qwen"].reasoning.dialect == "passthrough"


def test_open_tables_for_other_features(tmp_path):
    text = MINIMAL + "\n[security]\nanything = 1\n[retention]\ndays = 30\n[probe]\nextra = true\n"
    c = load(write(tmp_path, text))
    assert c.security == {"anything": 1} and c.retention == {"days": 30}


def test_strict_makes_unmappable_reasoning_an_error(tmp_path):
    c = load(write(tmp_path, "strict = true\n" + MINIMAL))
    assert c.models["qwen"].reasoning.reject_unmappable is True


# (what the file contains, what the error must say)
ERRORS = [
    (
        MINIMAL + 'sampling.top_p = { max = "0.95" }\n',
        "models.qwen.sampling.top_p.max: found '0.95' (a string), expected a number",
    ),
    (
        MINIMAL + "sampling.top_p = 1.5\n",
        "models.qwen.sampling.top_p: found 1.5 (a number), expected a number <= 1",
    ),
    (
        MINIMAL + "sampling.temprature = 0.6\n",
        "models.qwen.sampling.temprature: found an unknown key, expected one of frequency_penalty, max_tokens",
    ),
    (
        MINIMAL + "sampling.top_k = 2.5\n",
        "models.qwen.sampling.top_k: found 2.5 (a number), expected an integer",
    ),
    (
        MINIMAL + 'sampling.top_p = { mode = "always" }\n',
        "models.qwen.sampling.top_p.mode: found 'always' (a string), expected one of fill, override, clamp, drop",
    ),
    (
        MINIMAL + 'sampling.top_p = { mode = "clamp" }\n',
        "models.qwen.sampling.top_p: found mode 'clamp' without bounds, expected min and/or max",
    ),
    (
        MINIMAL + "sampling.top_p = { min = 0.9, max = 0.5 }\n",
        "models.qwen.sampling.top_p.min: found 0.9 > max 0.5, expected min <= max",
    ),
    (MINIMAL + 'sampling.top_p = { mode = "drop", value = 0.5 }\n', "found mode 'drop' with value/min/max"),
    (
        MINIMAL + 'reasoning.dialect = "vllmm"\n',
        "models.qwen.reasoning.dialect: found 'vllmm' (a string), expected one of",
    ),
    (MINIMAL + 'reasoning.levels = ["hi"]\n', "models.qwen.reasoning.levels.0: found 'hi'"),
    (MINIMAL + 'upstream = "gpu9"\n', "models.qwen.upstream: found 'gpu9', expected one of gpu0"),
    (
        MINIMAL.replace('engine = "vllm"', 'engine = "vlm"'),
        "upstreams.gpu0.engine: found 'vlm' (a string), expected one of vllm",
    ),
    (MINIMAL.replace('engine = "vllm"', ""), "upstreams.gpu0.engine: missing, expected one of vllm, sglang"),
    (
        MINIMAL.replace("http://", "ftp://"),
        "upstreams.gpu0.base_url: found 'ftp://127.0.0.1:8000/v1' (a string), expected an http:// or https:// URL",
    ),
    (MINIMAL.replace("[models.qwen]", ""), "models: missing, expected a [models.NAME] table"),
    ("listen = 8080\n" + MINIMAL, "listen: found 8080 (an integer), expected HOST:PORT"),
    ("colour = 1\n" + MINIMAL, "colour: found an unknown key, expected one of"),
    (
        MINIMAL + 'aliases = ["q"]\n[models.other]\naliases = ["q"]\n',
        "models.other.aliases: found 'q', which is already an alias of models.qwen",
    ),
    (
        MINIMAL + 'aliases = ["other"]\n[models.other]\n',
        "models.other: found the name 'other', which is already",
    ),
    (
        MINIMAL + '[upstreams.gpu1]\nbase_url = "http://x"\nengine = "sglang"\n',
        "models.qwen: missing key 'upstream', expected one of gpu0, gpu1",
    ),
    (
        '[models."Qwen/Qwen3-32B"]\nsampling.top_p = "x"\n' + MINIMAL.replace("[models.qwen]", ""),
        "models.\"Qwen/Qwen3-32B\".sampling.top_p: found 'x' (a string), expected a number or a table",
    ),
]


@pytest.mark.parametrize(("text", "expected"), ERRORS)
def test_errors_name_file_path_found_and_expected(tmp_path, text, expected):
    message, file = error_of(tmp_path, text)
    assert expected in message
    assert message.startswith(file + ": ")


def test_a_literal_key_is_refused_without_echoing_it(tmp_path):
    text = MINIMAL.replace('engine = "vllm"', 'engine = "vllm"\napi_key = "sk-live-abcdef123456"')
    message, _ = error_of(tmp_path, text)
    assert "upstreams.gpu0.api_key: found a credential written in the file, expected api_key_env" in message
    assert "abcdef123456" not in message
    assert message.count("upstreams.gpu0.api_key:") == 1


def test_a_key_in_api_key_env_is_redacted(tmp_path):
    message, _ = error_of(
        tmp_path, MINIMAL.replace('engine = "vllm"', 'engine = "vllm"\napi_key_env = "sk-live-abcdef123456"')
    )
    assert "upstreams.gpu0.api_key_env: found sk-… (redacted, 20 characters), expected the NAME" in message
    assert "abcdef" not in message


def test_every_problem_is_reported(tmp_path):
    text = MINIMAL + "sampling.top_p = 2\nsampling.min_p = -1\n"
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, text))
    assert len(info.value.problems) == 2


def test_toml_syntax_and_missing_file(tmp_path):
    message, file = error_of(tmp_path, "[upstreams\n")
    assert message.startswith(f"{file}: not valid TOML: ") and "line 1" in message
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load(tmp_path / "nope.toml")


def test_quick_mode():
    c = Config.quick(
        "http://127.0.0.1:8000/v1/", engine="sglang", generation_config="~/m/Qwen3", upstream_key_env="KEY"
    )
    assert c.is_quick and c.models == {}
    assert c.upstreams["default"].base_url == "http://127.0.0.1:8000/v1"
    assert c.upstreams["default"].api_key_env == "KEY"
    assert c.quick_model.reasoning.dialect == "sglang"
    assert c.quick_model.generation_config == Path("~/m/Qwen3").expanduser()


def test_quick_mode_without_engine_leaves_reasoning_alone():
    c = Config.quick("http://127.0.0.1:8000")
    assert c.upstreams["default"].engine is None
    assert c.quick_model.reasoning.dialect is None
    assert Config.quick("http://x", reasoning_dialect="int").quick_model.reasoning.dialect == "int"


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"engine": "vlm"}, "upstreams.default.engine"),
        ({"upstream_key_env": "sk-abc"}, "api_key_env"),
        ({"reasoning_dialect": "x"}, "reasoning.dialect"),
    ],
)
def test_quick_mode_validates_flags(kwargs, expected):
    with pytest.raises(ConfigError, match=expected):
        Config.quick("http://127.0.0.1:8000", **kwargs)
