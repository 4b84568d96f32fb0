"""Every training command the README shows parses as its program would parse it.

What is checked, without training and without touching the data:

- Extraction: every ``ns-train ...`` and ``odin-ns-train ...`` command in a shell code block
  of ``README.md`` (fenced, tagged ``bash``, ``sh``, ``shell``, ``console`` or ``zsh``;
  ``\\`` line continuations joined, ``#`` comments dropped, split as a POSIX shell splits
  it, a leading ``$`` prompt and ``VAR=value`` assignments skipped). Inline code spans of prose and untagged
  blocks (the file layout) are not read. One test per command, named by the command.
- Parsing, as the program does it: ``ns-train``'s arguments go to
  ``odin_ns.launch.parse_training_config`` (nerfstudio's own ``tyro.cli`` call on
  ``AnnotatedBaseConfigUnion``, plus its ``--data`` alias); ``odin-ns-train``'s first go
  through the launcher's own argparse flags (``odin_ns.launch._split_launcher_args``) and the
  rest through the same ``parse_training_config``, as the launcher and every rank do. A
  command tyro refuses (its usage box, ``SystemExit(2)``) fails its test.
- The parsed config reflects what the command shows: the method name; a dataparser
  subcommand selects that dataparser's config; every ``--flag value`` lands on the attribute
  it names (``--pipeline.sync.mode`` on ``config.pipeline.sync.mode``; after a dataparser
  subcommand, on ``config.pipeline.datamanager.dataparser``), and every launcher flag on the
  launcher's namespace. ``--downscale-factor 4`` after ``nerfstudio-data`` is checked by
  name too.
- Copy-paste safety: no token holds a shell metacharacter or usage bracket (``|``, ``[``,
  ``<``, ...), so a command runs as shown once its placeholder paths are replaced.
- The harness can fail: the README's former, broken form (``--downscale-factor`` before the
  dataparser subcommand) is refused, and extraction finds both programs.

Placeholders such as ``path/to/scene`` are fine: parsing does not read the data path (it is
checked later, by the launcher's preflight or by nerfstudio's dataparser when training
starts), so the commands parse on a machine without those folders. A command's test takes
a fraction of a second once nerfstudio's method configs are imported (the first test pays
for that import, seconds); the refused command takes a few seconds (tyro's suggestions).
"""

from __future__ import annotations

import shlex
import warnings
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
PROGRAMS = ("ns-train", "odin-ns-train")
SHELL_LANGUAGES = ("bash", "sh", "shell", "console", "zsh")
SHELL_METACHARACTERS = set("|&;<>()[]{}$`*?\"'\\")
# The README's former "Train on your data" line that tyro refuses with its usage box.
OLD_BROKEN = "ns-train odin-splatfacto --data path/to/scene --downscale-factor 4"


def readme_commands(text: str) -> list[list[str]]:
    """The ``ns-train`` / ``odin-ns-train`` commands of the fenced code blocks, as argv lists."""
    commands: list[list[str]] = []
    fence: str | None = None  # the open block's language, "" when untagged
    logical = ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = line.strip()[3:].strip().lower() if fence is None else None
            logical = ""
            continue
        if fence not in SHELL_LANGUAGES:
            continue
        if line.rstrip().endswith("\\"):  # a continuation: join with the next line
            logical += line.rstrip()[:-1] + " "
            continue
        tokens = shlex.split(logical + line, comments=True)
        logical = ""
        while tokens and (tokens[0] == "$" or "=" in tokens[0] and not tokens[0].startswith("-")):
            tokens = tokens[1:]  # a "$ " prompt, VAR=value before the program
        if tokens and tokens[0] in PROGRAMS:
            commands.append(tokens)
    return commands


COMMANDS = readme_commands(README.read_text())
IDS = [shlex.join(argv) for argv in COMMANDS]


def parse(argv: list[str]) -> tuple[Any | None, list[str], Any]:
    """(launcher namespace or None, training arguments, TrainerConfig) as ``argv[0]`` parses."""
    from odin_ns.launch import _split_launcher_args, parse_training_config

    launcher, rest = None, list(argv[1:])
    if argv[0] == "odin-ns-train":
        launcher, rest = _split_launcher_args(rest)
    with warnings.catch_warnings():  # nerfstudio's import-time deprecations
        warnings.simplefilter("ignore", FutureWarning)
        config = parse_training_config(rest)
    return launcher, rest, config


def dataparser_names() -> dict[str, Any]:
    """The dataparser subcommands ns-train offers (nerfstudio's and plugins'), by name."""
    from nerfstudio.configs.dataparser_configs import all_dataparsers

    return all_dataparsers


def shown_flags(rest: list[str]) -> tuple[str, str | None, list[tuple[str, list[str]]]]:
    """(method, dataparser subcommand or None, [(flag, values)]) of the training arguments.

    A flag's values are the tokens up to the next flag or subcommand; a flag seen after the
    dataparser subcommand is named ``dataparser:<flag>`` (tyro applies it to the dataparser).
    """
    method, tokens = rest[0], rest[1:]
    subcommands = dataparser_names()
    subcommand: str | None = None
    flags: list[tuple[str, list[str]]] = []
    for token in tokens:
        if token.startswith("--"):
            name, eq, value = token[2:].partition("=")
            scope = "dataparser:" if subcommand else ""
            flags.append((scope + name, [value] if eq else []))
        elif token in subcommands and (not flags or flags[-1][1]):
            assert subcommand is None, f"two dataparser subcommands: {subcommand}, {token}"
            subcommand = token
        else:
            assert flags, f"{token!r}: a value before any flag"
            flags[-1][1].append(token)
    return method, subcommand, flags


def resolve(root: Any, dotted: str) -> Any:
    obj = root
    for part in dotted.split("."):
        attr = part.replace("-", "_")
        assert hasattr(obj, attr), f"--{dotted}: {type(obj).__name__} has no {attr!r}"
        obj = getattr(obj, attr)
    return obj


def same_value(actual: Any, shown: list[str]) -> bool:
    """``actual`` is what tyro makes of the shown value tokens."""
    if isinstance(actual, tuple | list):
        return len(actual) == len(shown) and all(
            same_value(a, [v]) for a, v in zip(actual, shown, strict=True)
        )
    if len(shown) != 1:
        return False
    value = shown[0]
    if actual is None:
        return value == "None"
    if isinstance(actual, bool):
        return value == str(actual)
    if isinstance(actual, int | float):
        return type(actual)(value) == actual
    if isinstance(actual, Path):
        return Path(value) == actual
    return str(actual) == value


def test_readme_has_commands_of_both_programs():
    programs = {argv[0] for argv in COMMANDS}
    assert programs == set(PROGRAMS), f"README code blocks hold commands of {programs} only"


@pytest.mark.parametrize("argv", COMMANDS, ids=IDS)
def test_readme_command_parses(argv):
    bad = [token for token in argv if SHELL_METACHARACTERS & set(token)]
    assert not bad, f"tokens a shell would not pass as shown: {bad}"
    try:
        launcher, rest, config = parse(argv)
    except SystemExit as refused:  # tyro's (or the launcher's) usage message, on stderr
        pytest.fail(f"{argv[0]} refuses this command (exit {refused.code}): see stderr above")

    method, subcommand, flags = shown_flags(rest)
    assert config.method_name == method
    if subcommand is not None:
        expected = type(dataparser_names()[subcommand])
        assert type(config.pipeline.datamanager.dataparser) is expected
    dataparser = config.pipeline.datamanager.dataparser
    for flag, values in flags:
        if flag.startswith("dataparser:"):
            flag, root = flag.removeprefix("dataparser:"), dataparser
        else:
            root = config
        actual = resolve(root, flag)
        assert same_value(actual, values), f"--{flag} {' '.join(values)} parsed as {actual!r}"
    if config.data is not None:  # ns-train's --data alias
        assert config.pipeline.datamanager.data == config.data

    if launcher is not None:
        assert argv[-len(rest) :] == rest, "launcher flags after the method name"
        launcher_args = argv[1 : len(argv) - len(rest)]
        for flag, values in shown_flags(["-", *launcher_args])[2]:
            actual = getattr(launcher, flag.replace("-", "_"))
            assert same_value(actual, values), f"--{flag} {' '.join(values)} parsed as {actual!r}"


def test_downscale_factor_reaches_the_dataparser():
    shown = [argv for argv in COMMANDS if "--downscale-factor" in argv]
    assert shown, "the README shows no --downscale-factor command"
    for argv in shown:
        config = parse(argv)[2]
        factor = int(argv[argv.index("--downscale-factor") + 1])
        assert config.pipeline.datamanager.dataparser.downscale_factor == factor, shlex.join(argv)


def test_old_broken_form_is_refused(capsys):
    """The harness fails on a command tyro refuses: the README's former downscale line."""
    argv = shlex.split(OLD_BROKEN)
    assert argv not in COMMANDS
    with pytest.raises(SystemExit) as refused:
        parse(argv)
    assert refused.value.code == 2
    assert "--downscale-factor" in capsys.readouterr().err
