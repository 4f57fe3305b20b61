"""Drafters: everything that proposes tokens for the target to verify, behind one small interface."""
from .base import Drafter, DraftStop, NoDraft, Proposal
from .cross_tokenizer import CrossTokenizerDrafter
from .draft_model import DraftModelDrafter
from .layer_skip import LayerSkipDrafter, default_skip_layers
from .prompt_lookup import PromptLookupDrafter
from .eagle_tree import EagleTreeDrafter
from .tree_draft import STATIC_TREE, DynamicTreeDrafter, TreeShape
from .suffix import SuffixDrafter, SuffixStore

__all__ = ["Drafter", "DraftStop", "NoDraft", "Proposal", "CrossTokenizerDrafter", "DraftModelDrafter",
           "LayerSkipDrafter", "PromptLookupDrafter",
           "default_skip_layers", "DynamicTreeDrafter", "EagleTreeDrafter",
           "TreeShape", "STATIC_TREE", "SuffixDrafter", "SuffixStore"]
