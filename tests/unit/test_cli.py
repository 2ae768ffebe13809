"""The hpcddp command as a user meets it: exit codes, messages, --version, plain help."""

import importlib.metadata
import subprocess
import sys

import pytest


def hpcddp(*args):
    return subprocess.run([sys.executable, "-m", "hpcddp", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args, message", [((), "no command given"),
                                           (("frobnicate",), "unknown command 'frobnicate'")])
def test_no_command_or_an_unknown_one_is_a_usage_error(args, message):
    done = hpcddp(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "choose one of doctor, horovodrun, lost, pack, predict, timeline" in done.stderr
    assert done.stderr.startswith("usage: hpcddp") and done.stdout == ""


def test_help_is_not_an_error():
    done = hpcddp("--help")
    assert done.returncode == 0 and "doctor" in done.stdout and done.stderr == ""


@pytest.mark.parametrize("args", [("--version",), ("doctor", "--version"), ("pack", "--version"),
                                  ("predict", "--version"), ("timeline", "--version"),
                                  ("lost", "--version")])
def test_version_is_the_installed_distributions(args):
    done = hpcddp(*args)
    assert done.returncode == 0
    assert done.stdout.strip() == f"hpcddp {importlib.metadata.version('hpcddp')}"


@pytest.mark.parametrize("command", ["doctor", "lost", "pack", "predict", "timeline"])
def test_command_help_is_plain_text(command):
    done = hpcddp(command, "--help")
    assert done.returncode == 0 and f"usage: hpcddp {command}" in done.stdout
    assert "`" not in done.stdout


def test_a_command_with_bad_arguments_exits_2_and_names_them():
    done = hpcddp("pack")
    assert done.returncode == 2 and "the following arguments are required: out" in done.stderr
