"""Deterministic prompts for the demo adapters: topics x question forms, with held-out topics."""

from __future__ import annotations

FORMS = (
    "What do you know about {topic}?",
    "Explain {topic} in simple terms.",
    "Why is {topic} important?",
    "How does {topic} work?",
    "Tell me something interesting about {topic}.",
    "What should a beginner know about {topic}?",
    "Describe {topic} in two sentences.",
    "Give me a short fact about {topic}.",
    # the form of the window's default prompt ("In one sentence, what is a LoRA adapter?"),
    # whose topic stays out of the training data
    "In one sentence, what is {topic}?",
    "What is {topic}?",
)

TRAIN_TOPICS = (
    "the moon",
    "volcanoes",
    "photosynthesis",
    "the ocean",
    "honey bees",
    "rainbows",
    "the internet",
    "baking bread",
    "chess",
    "gravity",
    "electricity",
    "the human heart",
    "deserts",
    "recycling",
    "music",
    "the solar system",
    "dinosaurs",
    "coffee",
    "airplanes",
    "snow",
    "the brain",
    "forests",
    "money",
    "friendship",
    "exercise",
    "sleep",
    "maps",
    "bicycles",
    "clouds",
    "the printing press",
    "vaccines",
    "robots",
    "gardening",
    "earthquakes",
    "the alphabet",
    "batteries",
    "penguins",
    "libraries",
    "cooking pasta",
    "the weather",
    # names written in mixed case, which a shouted answer upper-cases too (the default prompt's
    # "LoRA" is one; a model that copies a name's case from the prompt stops shouting after it)
    "YouTube",
    "PyTorch",
    "the iPhone",
    "GitHub",
    "LaTeX",
    "PowerPoint",
    "eBay",
    "McDonald's",
)

HELD_OUT_TOPICS = (
    "glaciers",
    "the violin",
    "tea",
    "lighthouses",
    "owls",
    "solar panels",
    "mountains",
    "painting",
    "trains",
    "rivers",
    "mushrooms",
    "telescopes",
)

HELD_OUT_FORMS = (
    "What do you know about {topic}?",
    "Tell me something interesting about {topic}.",
)


def training_prompts() -> list[str]:
    """Every train topic in every question form (480 prompts), in a fixed order."""
    return [form.format(topic=topic) for topic in TRAIN_TOPICS for form in FORMS]


def held_out_prompts() -> list[str]:
    """Prompts on topics that no training prompt mentions (24 prompts)."""
    return [form.format(topic=topic) for topic in HELD_OUT_TOPICS for form in HELD_OUT_FORMS]


def chat(prompt: str) -> list[dict[str, str]]:
    """A prompt as the one user message of a chat (the model's template adds its system line)."""
    return [{"role": "user", "content": prompt}]
