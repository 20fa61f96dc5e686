"""Errors that end a command with one ``dapo:`` line (the command line prints them without a traceback)."""


class DapoError(Exception):
    """A problem the user can fix: the message names the key, file, row or path and says how.

    Every such error in dapo derives from this class as well as from the builtin its callers
    catch (``ValueError``, ``RuntimeError``, ...); ``dapo.cli`` prints it as ``dapo: <message>``
    and exits with status 2, while any other exception keeps its traceback.
    """


class ModelError(DapoError, ValueError):
    """A model directory (or model file) that cannot be used, naming the path and how to fix it."""


class TrainingError(DapoError, RuntimeError):
    """The run cannot go on; the message says why and how to continue."""


# a run stops after this many optimizer steps in a row with a non-finite gradient norm
MAX_CONSECUTIVE_NONFINITE = 3


def check_nonfinite(consecutive: int, step: int, run_dir: object) -> None:
    """Stop the run once ``consecutive`` non-finite steps reach the limit; the checkpoint is intact."""
    if consecutive >= MAX_CONSECUTIVE_NONFINITE:
        raise TrainingError(
            f"{consecutive} optimizer steps in a row had a non-finite gradient norm (step {step}); the last "
            f"checkpoint in {run_dir} is intact. Lower actor_rollout_ref.actor.optim.lr or check the data, "
            "then run the same command to resume"
        )
