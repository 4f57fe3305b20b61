"""The Batch tab: several prompts decoded together, rows advancing at their own rates (decoders/batch)."""
