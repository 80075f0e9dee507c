"""Write data/train_prompts/train.jsonl: the distillation prompt set for minispec's draft model.

Every phrase here was written for minispec and is combined by fixed-seed templates, so the file
is reproducible: ``python data/train_prompts/build_prompts.py``. None of it comes from
data/prompts/ (held out for evaluation). Routes: chat (questions, how-to, short writing),
copy (repeat or lightly edit a passage) and json (structured output from a description).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED = 2025

CONCEPTS = [
    "inflation", "compound interest", "a black hole", "plate tectonics", "the water cycle", "machine learning",
    "a blockchain", "the immune system", "gravity", "a recession", "supply and demand", "DNA",
    "the greenhouse effect", "a neural network", "photosynthesis in desert plants", "the stock market",
    "a vaccine", "an electric motor", "a solar panel", "the internet", "a compiler", "recursion",
    "a hash table", "the Pythagorean theorem", "probability", "a budget deficit", "democracy",
    "the Renaissance", "the Industrial Revolution", "ocean tides", "a rainbow", "an earthquake",
    "a volcano", "evolution by natural selection", "antibiotics", "the placebo effect", "jet lag",
    "a credit score", "a mortgage", "cloud computing", "encryption", "a database index", "a sorting algorithm",
    "opportunity cost", "the moon's phases", "static electricity", "sound waves", "a lever", "friction",
    "metabolism", "the nervous system", "caffeine", "a thunderstorm", "the seasons", "carbon dating",
]
TASKS = [
    "make a cup of green tea", "change a flat bicycle tyre", "write a cover letter", "start running as a beginner",
    "save money on groceries", "learn a new language", "clean a cast iron pan", "plant tomatoes",
    "prepare for a job interview", "organize a small closet", "write a thank-you note", "make pancakes",
    "read a file line by line in Python", "sort a dictionary by value in Python", "center a div with CSS",
    "undo the last commit in git", "write a for loop in JavaScript", "make a simple budget",
    "stop procrastinating", "take better notes in class", "train a puppy to sit", "care for a succulent",
    "remove a coffee stain from a shirt", "back up photos from my phone", "give a short speech",
    "cook rice on the stove", "stay focused while working from home", "choose a good watermelon",
    "set up a home aquarium", "calm down before an exam", "pack light for a weekend trip",
    "write a haiku", "fold a paper airplane", "make a smoothie", "check a car's tyre pressure",
    "count the words in a string in Python", "reverse a string in JavaScript", "find the largest number in a list",
    "make a good first impression", "improve my handwriting", "bake banana bread", "keep houseplants alive",
]
THINGS = [
    "the ocean", "autumn leaves", "a lighthouse", "a rainy morning", "an old bicycle", "a city at night",
    "a cup of coffee", "a mountain lake", "a lost cat", "the first snow", "a library", "a summer storm",
    "a train journey", "a garden in spring", "friendship", "the moon", "a busy kitchen", "an empty beach",
]
PLACES = [
    "Kyoto", "Barcelona", "Vienna", "Cape Town", "Montreal", "Edinburgh", "Istanbul", "Buenos Aires",
    "Prague", "Seoul", "Marrakech", "Reykjavik", "Copenhagen", "Hanoi", "Lima", "Dublin", "Athens", "Oslo",
]
FOODS = ["lentils", "spinach", "salmon", "chickpeas", "oats", "mushrooms", "sweet potatoes", "tofu",
         "broccoli", "quinoa", "eggs", "apples", "rice", "carrots", "yogurt", "cabbage"]
COMPARISONS = [
    ("a laptop", "a tablet"), ("renting", "buying a house"), ("cats", "dogs"), ("Python", "Java"),
    ("running", "swimming"), ("trains", "planes for short trips"), ("paper books", "e-readers"),
    ("tea", "coffee"), ("working from home", "working in an office"), ("SQL", "NoSQL databases"),
    ("electric cars", "petrol cars"), ("a gas stove", "an induction hob"),
]
CHAT_TEMPLATES = [
    ("concept", "Explain {x} in simple terms."), ("concept", "What is {x}? Keep the answer short."),
    ("concept", "How would you describe {x} to a ten-year-old?"),
    ("concept", "Give me a one-paragraph summary of {x}."),
    ("concept", "What are the main ideas behind {x}?"), ("task", "How do I {x}?"),
    ("task", "Give me three tips to {x}."), ("task", "What is the easiest way to {x}?"),
    ("task", "List the steps to {x}."), ("thing", "Write a short poem about {x}."),
    ("thing", "Write two sentences describing {x}."), ("thing", "Tell me a very short story about {x}."),
    ("place", "What are some things to do in {x}?"), ("place", "Tell me a few facts about {x}."),
    ("place", "What food is {x} known for?"), ("food", "Suggest a simple dinner recipe with {x}."),
    ("food", "Are {x} healthy? Why?"), ("food", "How should I store {x} so they last?"),
    ("pair", "What are the pros and cons of {x} compared with {y}?"), ("pair", "Which is better, {x} or {y}?"),
]
POOLS = {"concept": CONCEPTS, "task": TASKS, "thing": THINGS, "place": PLACES, "food": FOODS}

NAMES = ["Amara Osei", "Lukas Berger", "Priya Raman", "Tomas Novak", "Ines Duarte", "Kenji Mori", "Sofia Lindqvist",
         "Daniel Okafor", "Mei Chen", "Hugo Martin", "Leila Haddad", "Oliver Grant", "Nadia Petrova", "Rafael Costa"]
CITIES = ["Porto", "Graz", "Tampere", "Utrecht", "Ghent", "Bergen", "Lyon", "Krakow", "Turin", "Malmo", "Cork", "Brno"]
JOBS = ["architect", "baker", "pilot", "teacher", "software engineer", "pharmacist", "carpenter", "journalist",
        "veterinarian", "electrician", "librarian", "chef", "translator", "physiotherapist"]
PRODUCTS = [("Aero 5", "headphones", "Sonix"), ("Trail Pro", "hiking boots", "Ridgeway"),
            ("Nimbus", "desk lamp", "Lumora"), ("Quick Brew", "coffee grinder", "Kaffa"),
            ("Vela 2", "electric scooter", "Motiva"), ("Pocket Cam", "action camera", "Orbis"),
            ("Silk Step", "running shoes", "Paceline"), ("Frost 300", "mini fridge", "Coolbay")]
EVENTS = ["jazz night", "book fair", "science lecture", "food festival", "chess tournament", "film screening",
          "pottery workshop", "charity run", "poetry reading", "robotics fair"]
VENUES = ["the town hall", "Riverside Park", "the old library", "Harbour Hall", "the community centre",
          "the university aula"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]

OPENINGS = [
    "The {org} will close its {place} on {day} while new {item} are installed.",
    "Starting next {day}, the {org} will open its {place} one hour earlier.",
    "This week the {org} is collecting old {item} for a local charity.",
    "Visitors to the {place} of the {org} should note that parking has moved.",
]
MIDDLES = [
    "Staff will be on hand to answer questions and to help anyone who needs directions.",
    "Please bring a valid card with you, because the front desk cannot issue new ones that day.",
    "Anyone with a booking for that day will receive an email with a new time slot.",
    "The work is expected to take about three hours, and it should not cause much noise.",
    "Children under twelve must be accompanied by an adult at all times.",
    "Refreshments will be served in the entrance hall from ten in the morning.",
    "We thank everyone for their patience and hope the changes make each visit easier.",
    "Questions can be sent to the help desk, which replies within two working days.",
    "The side entrance will stay open for deliveries and for visitors using wheelchairs.",
    "A printed map of the new layout is available next to the lifts on every floor.",
]
ORGS = ["city library", "sports club", "museum of maps", "garden society", "swimming centre", "art college",
        "health clinic", "music school", "science park", "youth hostel"]
SPOTS = ["reading room", "main hall", "north entrance", "cafe", "east wing", "front office"]
ITEMS = ["shelves", "lights", "coats", "computers", "windows", "chairs", "bicycles", "books"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
COPY_INSTRUCTIONS = [
    "Repeat this text word for word.", "Please copy the text below without any changes.",
    "Rewrite the following notice in the past tense, changing nothing else.",
    "Turn this notice into a bulleted list, one bullet per sentence.",
    "Make the following notice sound more friendly, but keep every fact.",
    "Copy the notice below, but replace the day {day} with {day2}.",
    "Shorten this notice to two sentences.", "Repeat the notice and then add one sentence thanking the reader.",
]


def chat_prompts(rng: random.Random, n: int) -> list[str]:
    out = set()
    while len(out) < n:
        kind, template = rng.choice(CHAT_TEMPLATES)
        if kind == "pair":
            x, y = rng.choice(COMPARISONS)
            out.add(template.format(x=x, y=y))
        else:
            out.add(template.format(x=rng.choice(POOLS[kind])))
    return sorted(out)


def passage(rng: random.Random) -> tuple[str, str]:
    fill = dict(org=rng.choice(ORGS), place=rng.choice(SPOTS), item=rng.choice(ITEMS), day=rng.choice(DAYS))
    text = " ".join([rng.choice(OPENINGS).format(**fill)] + rng.sample(MIDDLES, rng.randint(3, 5)))
    return text, fill["day"]


def copy_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        text, day = passage(rng)
        day2 = rng.choice([d for d in DAYS if d != day])
        instruction = rng.choice(COPY_INSTRUCTIONS).format(day=day, day2=day2)
        out.append(f"{instruction}\n\n{text}")
    return out


def json_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            name, city, job, age = rng.choice(NAMES), rng.choice(CITIES), rng.choice(JOBS), rng.randint(21, 68)
            text = f"{name} works as a {job} in {city}. {name.split()[0]} turned {age} this year."
            keys = ["name", "age", "city", "job"]
        elif kind == 1:
            model, thing, brand = rng.choice(PRODUCTS)
            price, stock = rng.randint(15, 400), rng.choice(["in stock", "sold out"])
            text = f"The {model} {thing} made by {brand} sells for {price} dollars and is {stock} right now."
            keys = ["model", "category", "brand", "price_usd", "available"]
        else:
            event, venue, month = rng.choice(EVENTS), rng.choice(VENUES), rng.choice(MONTHS)
            day, price = rng.randint(1, 28), rng.choice([0, 5, 8, 12, 20])
            text = f"A {event} takes place at {venue} on {month} {day}. Entry costs {price} euros."
            keys = ["event", "venue", "date", "price_eur"]
        key_list = ", ".join(f'"{k}"' for k in keys)
        ask = rng.choice([f"Write a JSON object with the fields {key_list} for this text. Output JSON only.",
                          f"Give the information below as JSON using the keys {key_list}.",
                          f"Fill in a JSON object with {key_list} from this sentence, and nothing else."])
        out.append(f"{ask}\n\n{text}")
    return out


def build(num_chat: int = 340, num_copy: int = 80, num_json: int = 80) -> list[dict]:
    rng = random.Random(SEED)
    rows = []
    for route, prompts in (("chat", chat_prompts(rng, num_chat)), ("copy", copy_prompts(rng, num_copy)),
                           ("json", json_prompts(rng, num_json))):
        for i, text in enumerate(prompts, 1):
            rows.append({"id": f"train-{route}-{i:03d}", "route": route,
                         "messages": [{"role": "user", "content": text}]})
    return rows


# a second, wider chat vocabulary for train_more.jsonl (question shapes the first set lacks)
WHY = [
    "leaves change colour in autumn", "bread goes stale", "owls hunt at night", "the sea is salty", "ice floats on water",
    "we get hiccups", "metal feels cold to the touch", "planes leave white trails in the sky", "we yawn",
    "the moon looks bigger near the horizon", "popcorn pops", "bubbles are round", "some people are left-handed",
    "fireflies glow", "a compass points north", "milk turns sour", "our ears pop on a plane", "stars twinkle",
    "cut apples turn brown", "old books smell sweet", "the desert gets cold at night", "birds fly in a V shape",
    "we dream", "glass is transparent", "soap removes grease", "the ocean has waves", "spicy food feels hot",
]
HOW_WORKS = [
    "a dishwasher", "a microwave oven", "GPS", "a touch screen", "a heat pump", "a bicycle gear", "Wi-Fi",
    "a search engine", "a credit card payment", "a noise-cancelling headphone", "a hybrid car", "a 3D printer",
    "a smoke detector", "an elevator", "a camera lens", "a password manager", "a wind turbine", "a thermostat",
    "public key cryptography", "a spell checker", "a recommendation system", "a barcode scanner", "an MRI scanner",
]
WORDS = ["serendipity", "ubiquitous", "meticulous", "resilient", "nostalgia", "pragmatic", "ambiguous",
         "candid", "frugal", "eloquent", "tenacious", "whimsical", "diligent", "benevolent", "obsolete",
         "procrastinate", "empathy", "verbose", "inevitable", "curious", "humble", "vivid"]
DIFFERENCES = [
    ("a sea", "an ocean"), ("a lake", "a pond"), ("a crocodile", "an alligator"), ("baking soda", "baking powder"),
    ("RAM", "storage"), ("a list", "a tuple in Python"), ("speed", "velocity"), ("a hurricane", "a tornado"),
    ("affect", "effect"), ("a debit card", "a credit card"), ("HTTP", "HTTPS"), ("a fruit", "a vegetable"),
    ("an atom", "a molecule"), ("a rabbit", "a hare"), ("revenue", "profit"), ("a comet", "an asteroid"),
    ("a frog", "a toad"), ("jam", "jelly"), ("a noun", "a verb"), ("git merge", "git rebase"),
]
ADVICE = [
    "I feel nervous before meeting new people", "I keep forgetting to drink water", "my plants keep dying",
    "I can't wake up early", "my desk is always messy", "I want to read more books", "I spend too much on coffee",
    "my phone battery drains fast", "I get bored at the gym", "I want to learn to cook", "I have too many emails",
    "I find it hard to say no", "my neighbour plays loud music", "I want to start a small garden",
    "I'm moving to a new city", "I have a job interview tomorrow", "my laptop is very slow",
    "I want to save for a holiday", "my cat scratches the sofa", "I can't focus when I study",
]
HISTORY = ["the printing press", "the bicycle", "chess", "the Olympic Games", "paper money", "the telephone",
           "coffee", "the light bulb", "the Great Wall of China", "the Eiffel Tower", "football", "the calendar",
           "pizza", "the compass", "vaccines", "the piano", "the World Wide Web", "tea", "maps", "the alphabet"]
SKILLS = ["juggling", "touch typing", "chess", "drawing faces", "playing the ukulele", "public speaking",
          "swimming", "knitting", "photography", "coding", "meditation", "baking bread", "sketching",
          "woodworking", "calligraphy", "rock climbing", "sewing", "bird watching", "gardening", "mental maths"]
CODE_TASKS = ["check if a number is prime", "remove duplicates from a list", "read a CSV file", "merge two dictionaries",
              "count vowels in a string", "find the average of a list", "convert Celsius to Fahrenheit",
              "check if a word is a palindrome", "sum the digits of a number", "flatten a nested list",
              "get today's date", "sort a list of names", "find the longest word in a sentence",
              "write a file", "generate a random password", "compute a factorial"]
MORE_TEMPLATES = [
    ("why", "Why do {x}?"), ("why", "Can you explain why {x}?"), ("why", "What is the reason {x}?"),
    ("works", "How does {x} work?"), ("works", "Explain briefly how {x} works."),
    ("works", "What are the main parts of {x}?"),
    ("word", "What does the word '{x}' mean?"), ("word", "Use the word '{x}' in two example sentences."),
    ("word", "Give me a synonym and an antonym for '{x}'."),
    ("diff", "What is the difference between {x} and {y}?"), ("diff", "How can I tell {x} from {y}?"),
    ("advice", "{x}. What should I do?"), ("advice", "{x}. Any advice?"),
    ("history", "Tell me briefly about the history of {x}."), ("history", "Who invented {x}, and when?"),
    ("skill", "How can a beginner get started with {x}?"), ("skill", "How long does it take to get good at {x}?"),
    ("skill", "What are common mistakes when learning {x}?"),
    ("code", "Write a Python function to {x}."), ("code", "Show me how to {x} in Python, with a short example."),
    ("place", "Plan a one-day visit to {x}."), ("place", "What is the weather like in {x} in spring?"),
    ("concept", "Why does {x} matter in everyday life?"), ("concept", "Give an example of {x}."),
    ("task", "What do I need before I {x}?"), ("thing", "Write a short, cheerful paragraph about {x}."),
    ("food", "What goes well with {x}?"),
]
MORE_POOLS = {"why": WHY, "works": HOW_WORKS, "word": WORDS, "diff": DIFFERENCES, "advice": ADVICE,
              "history": HISTORY, "skill": SKILLS, "code": CODE_TASKS, **POOLS}


def build_more(seen_rows: list[dict], num_chat: int = 900, num_copy: int = 60, num_json: int = 60) -> list[dict]:
    """train_more.jsonl: chat prompts from MORE_TEMPLATES (a wider set of question shapes), and some
    more copy and json prompts; none repeats a prompt of seen_rows."""
    seen = {r["messages"][0]["content"] for r in seen_rows}
    for held_out in sorted(Path(__file__).resolve().parents[1].joinpath("prompts").glob("*.jsonl")):
        seen |= {json.loads(line)["messages"][-1]["content"] for line in held_out.read_text().splitlines() if line}
    rng = random.Random(11)
    chat = set()
    combos = sum(len(MORE_POOLS[kind]) for kind, _ in MORE_TEMPLATES)
    while len(chat) < min(num_chat, combos):
        kind, template = rng.choice(MORE_TEMPLATES)
        x = rng.choice(MORE_POOLS[kind])
        chat.add(template.format(x=x[0], y=x[1]) if isinstance(x, tuple) else template.format(x=x))
    rows = []
    for route, prompts in (("chat", sorted(chat)), ("copy", copy_prompts(rng, num_copy)),
                           ("json", json_prompts(rng, num_json))):
        for i, text in enumerate([p for p in prompts if p not in seen], 1):
            rows.append({"id": f"more-{route}-{i:03d}", "route": route,
                         "messages": [{"role": "user", "content": text}]})
    return rows


def build_extra(train_rows: list[dict]) -> list[dict]:
    """train_extra.jsonl: every chat combination train.jsonl left out, and 150 more copy and json
    prompts (another seed), none repeating a train.jsonl prompt."""
    seen = {r["messages"][0]["content"] for r in train_rows}
    num_chat = sum(len(COMPARISONS) if kind == "pair" else len(POOLS[kind]) for kind, _ in CHAT_TEMPLATES)
    rng = random.Random(7)
    rows = []
    for route, prompts in (("chat", chat_prompts(rng, num_chat)), ("copy", copy_prompts(rng, 150)),
                           ("json", json_prompts(rng, 150))):
        for i, text in enumerate([p for p in prompts if p not in seen], 1):
            rows.append({"id": f"extra-{route}-{i:03d}", "route": route,
                         "messages": [{"role": "user", "content": text}]})
    return rows


if __name__ == "__main__":
    rows = build()
    extra = build_extra(rows)
    for name, part in (("train.jsonl", rows), ("train_extra.jsonl", extra), ("train_more.jsonl", build_more(rows + extra))):
        path = Path(__file__).with_name(name)
        path.write_text("".join(json.dumps(r) + "\n" for r in part))
        print(f"wrote {len(part)} prompts to {path}")
