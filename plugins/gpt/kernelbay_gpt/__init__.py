"""kernelbay-gpt: GPT-2, OPT, GPT-NeoX and Falcon, built from the engine's shared layers."""
