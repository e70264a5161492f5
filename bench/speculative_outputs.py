"""Sends every prompt of a JSONL dataset to a server's chat endpoint once, greedy and not
streamed, and prints the answers as JSON (for comparing two servers' outputs).

Usage: python3 bench/speculative_outputs.py BASE_URL DATASET.jsonl > outputs.json"""

import json
import sys
import urllib.request


def main():
    base, path = sys.argv[1], sys.argv[2]
    answers = []
    for line in open(path):
        item = json.loads(line)
        body = {
            "messages": [{"role": "user", "content": item["prompt"]}],
            "max_tokens": item["max_tokens"],
            "temperature": 0.0,
            "logprobs": True,
        }
        request = urllib.request.Request(
            f"{base}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=600) as response:
            reply = json.load(response)
        choice = reply["choices"][0]
        tokens = [t["token"] for t in (choice.get("logprobs") or {}).get("content") or []]
        answers.append({
            "text": choice["message"]["content"],
            "tokens": tokens,
            "finish_reason": choice["finish_reason"],
            "completion_tokens": reply["usage"]["completion_tokens"],
        })
    json.dump(answers, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
