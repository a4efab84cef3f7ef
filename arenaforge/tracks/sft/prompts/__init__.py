"""The sft track's prompt templates: `<name>.txt` beside this file."""

from arenaforge.services.prompts import prompt_loader

load_prompt = prompt_loader(__name__)
