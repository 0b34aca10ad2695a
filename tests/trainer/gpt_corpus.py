"""The GPT tests' corpus: 2160 bytes of common English words drawn with a fixed seed, a
sentence end now and then. Usage: gpt_corpus.py OUT (gpt.sh, gpt_cuda.sh)."""
import random, sys
words = ("the a of and to in is was that for on with as by at from his her it they an which "
         "or be this had not are but were one all their there been has when who will").split()
rng, text = random.Random(3), ""
while len(text) < 2160:
    text += rng.choice(words) + (". " if rng.random() < 0.1 else " ")
open(sys.argv[1], "w").write(text[:2160])
