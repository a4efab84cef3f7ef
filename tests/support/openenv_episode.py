"""Drive one OpenEnv server with OpenEnv's own client (run in the openenv venv: imports only openenv and stdlib).

    python openenv_episode.py BASE_URL CALLS_JSON
CALLS_JSON is a list of {"tool", "arguments"}; prints one JSON object: the reset's prompt, each step's observation,
ok and reward, and the final (ending) step's reward and done flag.
"""

import json
import sys

from openenv.core.generic_client import GenericEnvClient


def main() -> None:
    url, calls = sys.argv[1], json.loads(sys.argv[2])
    with GenericEnvClient(base_url=url).sync() as env:
        reset = env.reset()
        steps = []
        for c in calls:
            r = env.step({"tool": c["tool"], "arguments": c["arguments"]})
            steps.append({"observation": r.observation["observation"], "ok": r.observation["ok"], "reward": r.reward})
        end = env.step({"tool": ""})
    print(json.dumps({"prompt": reset.observation["prompt"], "steps": steps, "final_reward": end.reward,
                      "done": end.done}))


if __name__ == "__main__":
    main()
