"""Score BFCL answers with bfcl-eval's own code; run by the Python of `scripts/setup-bfcl.sh`'s venv, not imported.

stdin: one JSON object per line, {"id", "category" (BFCL's: simple_python, multiple, parallel), "function" (the item's
functions as BFCL ships them), "possible_answer" (its ground truth), "result" (the model's raw text)}.
stdout: one JSON object, {id: {"valid": bool, "error_type": str | null}}.

Each answer goes through exactly what `bfcl evaluate` does for an AST category: the model handler's `decode_ast`
(Qwen/Qwen3-0.6B-FC's handler, whose format is the Hermes `<tool_call>` JSON our policies write), then
`_evaluate_single_ast_entry` (decoder checks and `ast_checker`). Standard library and bfcl_eval only.
"""

import json
import sys

HANDLER = "Qwen/Qwen3-0.6B-FC"


def main() -> None:
    from bfcl_eval.constants.enums import Language, ReturnFormat
    from bfcl_eval.eval_checker.eval_runner import _evaluate_single_ast_entry, get_handler

    handler = get_handler(HANDLER)
    verdicts = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        row = json.loads(line)
        got = _evaluate_single_ast_entry(handler, row["id"], row["result"], row["possible_answer"],
                                         {"id": row["id"], "function": row["function"]}, HANDLER.replace("/", "_"),
                                         row["category"], language=Language.PYTHON, return_format=ReturnFormat.PYTHON)
        verdicts[row["id"]] = {"valid": bool(got["valid"]), "error_type": got.get("error_type")}
    json.dump(verdicts, sys.stdout)


if __name__ == "__main__":
    main()
