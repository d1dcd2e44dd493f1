import pytest

from omni_ray import cli


@pytest.mark.parametrize("verb", list(cli.VERBS))
def test_verb_help(verb, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([verb, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: omni-ray {verb}")
    assert cli.VERBS[verb][1] in " ".join(out.split())  # argparse wraps to the terminal


def test_top_level_help_lists_every_verb(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(verb in out for verb in cli.VERBS)


def test_no_verb_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([])
    assert e.value.code == 2
    assert "required: VERB" in capsys.readouterr().err
