"""The one settings mechanism: the environment rule, typed values, ``patch``, and the shared section."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

import fireclay_ir
from fireclay_ir.settings import Settings, setting


@dataclasses.dataclass
class Example(Settings, section="example"):
    flag: bool = setting(True, "a switch")
    count: int = setting(3, "a number")
    ratio: float = setting(0.5, "a fraction")
    name: str = setting("x", "a word")
    limit: int | None = setting(None, "a number or nothing")
    devices: tuple[str, ...] = setting(("cpu",), "device types")


@dataclasses.dataclass
class Shared(Settings, section=""):
    folder: str = setting("", "a folder")


def test_variable_names_follow_one_rule():
    assert Example.environment_variable("count") == "FIRECLAY_EXAMPLE_COUNT"
    assert Shared.environment_variable("folder") == "FIRECLAY_FOLDER"
    assert [i.variable for i in Example.describe()] == [
        "FIRECLAY_EXAMPLE_FLAG", "FIRECLAY_EXAMPLE_COUNT", "FIRECLAY_EXAMPLE_RATIO", "FIRECLAY_EXAMPLE_NAME",
        "FIRECLAY_EXAMPLE_LIMIT", "FIRECLAY_EXAMPLE_DEVICES"]


@pytest.mark.parametrize("field, raw, expected", [
    ("flag", "0", False), ("flag", "off", False), ("flag", "Yes", True), ("count", " 7 ", 7),
    ("ratio", "1e-3", 1e-3), ("name", "two words", "two words"), ("limit", "", None), ("limit", "12", 12),
    ("devices", "cpu, cuda", ("cpu", "cuda")), ("devices", "none", ()), ("devices", "0", ()),
])
def test_environment_values_parse_as_the_field_type(field, raw, expected):
    environ = {Example.environment_variable(field): raw}
    assert getattr(Example.from_environment(environ), field) == expected


@pytest.mark.parametrize("field, raw", [("flag", "perhaps"), ("count", "many"), ("ratio", "half")])
def test_a_bad_environment_value_names_the_variable(field, raw):
    with pytest.raises(ValueError, match=f"environment variable FIRECLAY_EXAMPLE_{field.upper()}: expected"):
        Example.from_environment({Example.environment_variable(field): raw})


def test_unset_variables_keep_the_defaults_and_given_values():
    settings = Example.from_environment({}, count=9)
    assert settings.as_dict() == {"flag": True, "count": 9, "ratio": 0.5, "name": "x", "limit": None,
                                  "devices": ("cpu",)}


@pytest.mark.parametrize("field, value", [("flag", 1), ("count", True), ("count", "3"), ("ratio", "0.1"),
                                          ("limit", 2.5), ("devices", ["cpu"]), ("name", None)])
def test_assigning_a_value_of_another_type_is_refused(field, value):
    settings = Example()
    with pytest.raises(TypeError, match=f"{field} expects"):
        setattr(settings, field, value)
    with pytest.raises(TypeError, match=f"{field} expects"):
        settings.patch(**{field: value})


def test_unknown_names_are_refused_with_the_list():
    settings = Example()
    with pytest.raises(AttributeError, match="no setting 'cuont'; settings are: count, devices, flag"):
        settings.cuont = 1
    with pytest.raises(AttributeError, match="no setting 'cuont'"):
        settings.patch(cuont=1)


def test_patch_restores_after_a_block_an_error_and_a_decorated_call():
    settings = Example()
    with settings.patch(count=5, limit=2):
        assert (settings.count, settings.limit) == (5, 2)
        with settings.patch(count=6):
            assert settings.count == 6
        assert settings.count == 5
    assert (settings.count, settings.limit) == (3, None)
    with pytest.raises(RuntimeError), settings.patch(flag=False):
        raise RuntimeError
    assert settings.flag is True

    @settings.patch(name="inside")
    def read():
        return settings.name

    assert read() == "inside" and settings.name == "x"


def test_the_shared_section_drives_boundary_verification():
    assert fireclay_ir.config.environment_variable("verify") == "FIRECLAY_VERIFY"
    with fireclay_ir.config.patch(verify=True):
        assert fireclay_ir.verify_at_boundaries()
    with fireclay_ir.config.patch(verify=False):
        assert not fireclay_ir.verify_at_boundaries()


def test_the_shared_section_reads_the_environment_at_import():
    code = "import fireclay_ir; print(fireclay_ir.config.cache_dir, fireclay_ir.config.verify)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"FIRECLAY_CACHE_DIR": "/somewhere", "FIRECLAY_VERIFY": "1",
                              "PYTHONPATH": ":".join(sys.path)})
    assert out.stdout.split() == ["/somewhere", "True"]
