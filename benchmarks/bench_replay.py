"""Speed of the decoding replay (fi_toolkit/compress/replay.py; the target: <= 1.3x one plain forward over
the sequence plus the compressions' scoring), ratios side by side in one run.

SmolLM2 on a bundled book, a 4,096-token sequence, prompt 1,024, compression every 1,024 fed tokens:
  plain        one chunked forward over the sequence through a cache (what a replay's reference costs)
  replay       the whole replay: that reference, the compressed pass block by block, and the KL,
               top-1 and NLL at every position
  compressed   replay minus plain: the compressed pass and the scoring of every position
  scoring      the compressions' own scoring (signals -> keep map -> gather), from the decoder's clock

    .venv/bin/python benchmarks/bench_replay.py [--tokens 4096] [--prompt 1024] [--interval 1024] [--policy infokv]
"""

from __future__ import annotations

import argparse
import time

import torch

from fi_toolkit.compress import replay as replay_module
from fi_toolkit.documents import load_document
from fi_toolkit.model.loading import load_model
from fi_toolkit.policies import make_policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--interval", type=int, default=1024)
    ap.add_argument("--policy", default="infokv")
    ap.add_argument("--budget", default="keep=0.25")
    args = ap.parse_args()
    lm = load_model()
    doc = load_document("lcet10", lm.tokenizer, max_tokens=args.tokens)
    ids = doc.ids[: args.tokens]
    policy = make_policy(args.policy, budget=args.budget)
    clock = {}
    original = replay_module.CompressedDecoder

    class Timed(original):  # records the compressions' own scoring time
        def close(self):
            clock["scoring"] = self.compression_seconds
            super().close()

    replay_module.CompressedDecoder = Timed
    t0 = time.perf_counter()
    replay_module._reference_hidden(lm.model, ids[:-1], args.prompt - 1, 2048)
    plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = replay_module.replay(lm.model, ids, args.prompt, policy, args.interval)
    total = time.perf_counter() - t0
    replay_module.CompressedDecoder = original
    compressed, scoring = total - plain, clock["scoring"]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, SmolLM2-135M float32 CPU, {args.tokens} "
        f"tokens, "
        f"prompt {args.prompt}, interval {args.interval}, {policy.label}, {len(result.compressions)} compressions"
    )
    print(f"plain forward over the sequence          {plain:7.1f} s")
    print(f"replay (reference + compressed + scores) {total:7.1f} s")
    print(
        f"compressed pass + per-position scores    {compressed:7.1f} s  = {compressed / (plain + scoring):.2f}x "
        f"(plain forward + the compressions' scoring, {scoring:.1f} s)"
    )
    print(f"mean KL {float(result.kl.mean()):.4f} nats, top-1 agreement {float(result.top1_agree.float().mean()):.3f}")


if __name__ == "__main__":
    main()
