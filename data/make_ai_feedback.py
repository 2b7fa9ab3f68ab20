"""Run chapter 19b's Constitutional AI and RLAIF experiments; write data/ai_feedback/results.json.

    OMP_NUM_THREADS=1 .venv/bin/python data/make_ai_feedback.py     # about 8 minutes on one thread

SmolLM2-135M-Instruct (llmbook.inference.gguf.load_model) judges 256 of chapter 17's training
pairs in both orders, critiques and revises 32 of the text model's responses; the text
model is LoRA-fine-tuned on the revisions; reward models are trained on the AI labels and on
the true labels of the same pairs, and best-of-n and a short PPO run use each. The whole
recipe is ``AI_FEEDBACK_RECIPE`` and the work is llmbook.alignment.ai_feedback.run_ai_feedback.
Writes ``results.json``: the recipe, the judge's probabilities and statistics, the critiques
and revisions, the SFT, reward-model, best-of-n and PPO results, the time of each stage, and
the machine. Rerunning on another CPU gives close but not identical numbers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

from llmbook.alignment.ai_feedback import AI_FEEDBACK_RECIPE, run_ai_feedback
from llmbook.paths import data_path
from llmbook.training.pretrained import machine_facts


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    info = run_ai_feedback(AI_FEEDBACK_RECIPE)
    info["made"] = {"command": "python data/make_ai_feedback.py", "date": datetime.date.today().isoformat(),
                    **machine_facts()}
    folder = data_path("ai_feedback")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(info, indent=1) + "\n")
    print(json.dumps(info["judge"]["statistics"]), info["seconds"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
