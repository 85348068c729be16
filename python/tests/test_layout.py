"""The code's layout keeps its promises (docs/architecture.md): the drivers name no scheme, and
no two modules of a crate or package import each other in a circle."""
import re

import pytest

from inalab import schemes

from conftest import REPO

DRIVERS = ["inalab-sim", "inalab-net"]


def code_lines(path):
    """Lines of Rust source without comments (`//` to the end of a line) and without unit-test
    modules (a top-level `#[cfg(test)]` item, to its closing brace): a test picks a concrete
    scheme to drive the driver with, which is no scheme named in what the driver does."""
    depth, in_test = 0, False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        code = re.sub(r"//.*", "", line)
        if line.startswith("#[cfg(test)]") and depth == 0:
            in_test, seen = True, False
            continue
        depth += code.count("{") - code.count("}")
        if in_test:
            # The item ends where its braces close, or at its `;` (a `use` or a `const`).
            seen = seen or "{" in code
            in_test = not (depth == 0 and (seen or code.rstrip().endswith(";")))
            continue
        yield n, code


def scheme_tokens(line: str, names) -> list:
    """Words of `line` that name a scheme: the name itself (`atp`, `"switchml"`), or an
    identifier built on it (`atp_layout`, `AtpWorker`, `SwitchMlJob`)."""
    camel = {n: "".join(part.capitalize() for part in n.split("_")) for n in names}
    hits = []
    for word in re.findall(r"\w+", line):
        low = word.lower()
        if any(low == n or low.startswith(n + "_") or word.startswith(camel[n]) or low.startswith(n.replace("_", ""))
               for n in names):
            hits.append(word)
    return hits


@pytest.mark.parametrize("crate", DRIVERS)
def test_drivers_name_no_scheme(crate):
    # "ps" also names the parameter-server role (the `inalab ps` process), which the runtime
    # hosts for any scheme with servers; the other names are schemes only.
    names = [n for n in schemes.names() if n != "ps"]
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()}"
             for p in sorted((REPO / "crates" / crate / "src").rglob("*.rs"))
             for n, line in code_lines(p) if scheme_tokens(line, names)]
    assert not found, "a driver names a scheme:\n" + "\n".join(found)


def test_unit_tests_at_the_foot_are_not_driver_code(tmp_path):
    src = tmp_path / "x.rs"
    src.write_text('fn f() { run("atp") } // ring\n#[cfg(test)]\nmod tests {\n    fn t() { f("switchml") }\n}\n'
                   'fn g() -> u8 { rina() }\n#[cfg(test)]\nmod more { fn u() { canary() } }\n#[cfg(test)]\nuse x::grid;\nfn h() {}\n')
    assert list(code_lines(src)) == [(1, 'fn f() { run("atp") } '), (6, "fn g() -> u8 { rina() }"), (11, "fn h() {}")]


def test_the_scheme_finder_finds_names():
    names = ["atp", "switchml", "ps_sharded", "ring"]
    assert scheme_tokens('let x = AtpWorker::new(atp_layout(), "switchml"); // ring', names) == ["AtpWorker", "atp_layout", "switchml", "ring"]
    assert scheme_tokens("let s: String = during(ps, PsShardedX);", names) == ["PsShardedX"]


def cycle(graph: dict) -> list:
    """One import cycle of `graph` (module -> modules it imports), or []."""
    state: dict = {}

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                return path[path.index(d):] + [d] if d in path else [m, d]
            if d not in state:
                found = visit(d, path + [d])
                if found:
                    return found
        state[m] = "done"
        return []

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return []


def rust_modules(crate):
    src = REPO / "crates" / crate / "src"
    mods = {p.stem for p in src.glob("*.rs")} - {"lib", "main"}
    graph = {}
    for m in mods:
        text = "\n".join(line for _, line in code_lines(src / f"{m}.rs"))
        used = set(re.findall(r"crate::(\w+)", text))
        for group in re.findall(r"use crate::\{([^}]*)\}", text):
            used |= set(re.findall(r"(?:^|,)\s*(\w+)", group))
        graph[m] = (used & mods) - {m}
    return graph


@pytest.mark.parametrize("crate", sorted(p.name for p in (REPO / "crates").iterdir() if (p / "src").is_dir()))
def test_no_rust_module_imports_in_a_circle(crate):
    assert cycle(rust_modules(crate)) == []


@pytest.mark.parametrize("package", ["inalab", "inalab/analysis", "inalab/reproduce"])
def test_no_python_module_imports_in_a_circle(package):
    root = REPO / "python" / package
    mods = {p.stem for p in root.glob("*.py")} - {"__init__", "__main__"}
    graph = {m: (set(re.findall(r"^\s*from \.(\w+) import", (root / f"{m}.py").read_text(), re.M)) & mods) - {m}
             for m in mods}
    assert cycle(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []
