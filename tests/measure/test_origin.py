"""Where a failure came from decides its kind (bench.measure.origin): code in any install root of
an imported library, in the user site, or in Inductor's cache of generated code is a library's."""

import types
from pathlib import Path

import pytest

from bench.measure import origin


def _raised_in(filename: str, exc: BaseException) -> BaseException:
    """``exc`` raised from code whose file is ``filename`` (as a library's frame would show it)."""
    code = compile("def f(e):\n    raise e\n", filename, "exec")
    scope: dict = {}
    exec(code, scope)
    try:
        scope["f"](exc)
    except BaseException as caught:  # noqa: BLE001
        return caught
    raise AssertionError("unreachable")


def test_inductors_generated_code_is_the_librarys(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    exc = _raised_in(str(tmp_path / "inductor" / "ab" / "cabc123.py"), ValueError("shape not supported"))
    assert origin.origin(exc).who == "library"
    assert origin.classify(exc)[0] == "unsupported"  # a flex ValueError there: a refusal, not the variant's error


def test_the_default_inductor_cache_is_torchinductor_user_in_the_temporary_folder():
    assert origin.inductor_cache_dir({}, user="ann", tmp="/tmp") == Path("/tmp/torchinductor_ann")
    assert origin.inductor_cache_dir({"TORCHINDUCTOR_CACHE_DIR": "/x/y"}) == Path("/x/y")


def test_a_library_installed_outside_the_interpreters_paths_is_still_a_library(tmp_path):
    home = tmp_path / "elsewhere" / "triton"
    fake = types.SimpleNamespace(__file__=str(home / "__init__.py"))
    assert home.resolve() in origin.library_roots({"triton": fake})


def test_pip_user_installs_are_libraries(monkeypatch, tmp_path):
    import site

    user = tmp_path / "user-site"
    monkeypatch.setattr(site, "getusersitepackages", lambda: str(user))
    exc = _raised_in(str(user / "torch" / "nn" / "attention" / "x.py"), RuntimeError("not supported here"))
    assert origin.classify(exc)[0] == "unsupported"


def test_a_plugins_own_file_elsewhere_stays_the_variants(tmp_path):
    exc = _raised_in(str(tmp_path / "my_plugin.py"), ValueError("mode not supported"))
    assert origin.origin(exc).who == "variant" and origin.classify(exc)[0] == "error"


@pytest.mark.parametrize("name", ["torch", "numpy"])
def test_an_imported_librarys_root_is_among_the_roots(name):
    import importlib

    mod = importlib.import_module(name)
    assert Path(mod.__file__).resolve().parent in origin.library_roots()
