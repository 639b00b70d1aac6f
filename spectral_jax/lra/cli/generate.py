"""``spectral-jax generate``: continue a prompt with a trained byte-level language model.

    spectral-jax generate --workdir runs/lm_linear --prompt "GNU GENERAL " --max-new-tokens 80
    spectral-jax generate --workdir runs/lm_linear --prompt "The " --temperature 0.8 --seed 3

The run's checkpoint (``--checkpoint``, default the best) is restored into its
:class:`spectral_jax.nn.CausalLM`; the prompt's UTF-8 bytes are fed through the decoding cache,
then :func:`spectral_jax.nn.generate` adds ``--max-new-tokens`` bytes, greedily
(``--temperature 0``) or sampled with ``--seed``, one cached step each. The continuation is
printed alone on stdout (bytes that are not valid UTF-8 are shown as U+FFFD).
"""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Registers ``generate`` on the ``spectral-jax`` command."""
    gen = subparsers.add_parser(
        "generate", help="continue a prompt with a trained language-model run",
        description="Restore a byte-level LM run (task bytes_lm) and print the continuation "
        "of --prompt, decoded with the attention method's cache one byte at a time.",
    )
    gen.add_argument("--workdir", required=True, help="a run trained on task bytes_lm")
    gen.add_argument("--prompt", required=True, help="the text to continue (UTF-8)")
    gen.add_argument("--max-new-tokens", type=int, default=100, help="bytes to generate")
    gen.add_argument("--temperature", type=float, default=0.0,
                     help="0: greedy (argmax); above 0: sample from softmax(logits / T)")
    gen.add_argument("--seed", type=int, default=0, help="the sampling seed")
    gen.add_argument("--checkpoint", default="best", help="best, latest or a step")
    gen.set_defaults(func=_generate)


def continuation(workdir: str, prompt: str, max_new_tokens: int, *, temperature: float = 0.0,
                 seed: int = 0, checkpoint: str = "best") -> str:
    """The text ``spectral-jax generate`` prints for these arguments.

    Raises:
        FileNotFoundError: no run or no checkpoint in ``workdir``.
        spectral_jax.UsageError: the run is not a language model; an empty prompt; a prompt
          and continuation longer than the model's ``max_length``; a negative temperature.
    """
    import jax
    import numpy as np
    from flax import nnx

    from spectral_jax import UsageError
    from spectral_jax.lra.data.tokens import encode_bytes
    from spectral_jax.lra.train import objectives
    from spectral_jax.lra.train import workdir as workdir_lib
    from spectral_jax.lra.train.run import restore_for_evaluation
    from spectral_jax.nn import generate

    task = workdir_lib.read_config(workdir).task
    objective = objectives.task_objective(task)
    if objective != objectives.NEXT_TOKEN:
        what = ("a classifier" if objective == objectives.CLASSIFICATION
                else f"whose objective is {objective!r}, not byte text")
        raise UsageError(
            f"generate: the run in {workdir} trained task {task!r}, {what}; generate "
            "needs a language-model run (task 'bytes_lm', config lm/bytes)")
    data = prompt.encode("utf-8")
    if not data:
        raise UsageError("generate: `prompt` is empty; give at least one character")
    run, state, _ = restore_for_evaluation(workdir, checkpoint)
    with jax.set_mesh(run.mesh):
        model, _ = nnx.merge(run.setup.graphdef, run.setup.rng_state, state)
        new = generate(model, encode_bytes(data)[None], max_new_tokens,
                       temperature=temperature, seed=seed, banned_tokens=(0,))
    return (np.asarray(new[0]) - 1).astype(np.uint8).tobytes().decode("utf-8", "replace")


def _generate(args: argparse.Namespace) -> int:
    text = continuation(args.workdir, args.prompt, args.max_new_tokens,
                        temperature=args.temperature, seed=args.seed,
                        checkpoint=args.checkpoint)
    sys.stdout.write(text + "\n")
    return 0
