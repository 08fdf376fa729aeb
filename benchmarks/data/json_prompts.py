"""Structured-output prompts: 24 short texts, each with the JSON schema of what to extract from it, written for
this benchmark (nothing was fitted on them), as JSONL: ``{"id", "prompt", "schema"}``.

    python3 benchmarks/data/json_prompts.py --out /tmp/json_prompts.jsonl

Each prompt is a text, an instruction naming the fields, and ``JSON:`` (Gemma 3 270M is a base model: the JSON
follows the prompt).  Every string field is bounded (``maxLength``) and every object closed, so a generation ends
in a complete JSON value.
"""

from __future__ import annotations

import argparse
import json


def _obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props, "required": required or list(props),
            "additionalProperties": False}


def _s(n: int = 40) -> dict:
    return {"type": "string", "maxLength": n}


def _i(lo: int = 0, hi: int = 100000) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


ITEMS = [
    ("person", "Maria Lopez is a 34-year-old nurse who lives in Madrid.", "the person's name, age, job and city",
     _obj({"name": _s(), "age": _i(0, 130), "job": _s(), "city": _s()})),
    ("product", "The Aurora X2 headphones cost $129 and come in black or silver.", "the product's name, price in "
     "dollars and colours", _obj({"name": _s(), "price": _i(), "colors": {"type": "array", "items": _s(20),
                                                                          "maxItems": 5}})),
    ("event", "The Lisbon Jazz Festival runs from 12 July to 15 July 2025 at Parque Eduardo VII.",
     "the event's name, start date, end date and venue", _obj({"name": _s(), "start": _s(20), "end": _s(20),
                                                               "venue": _s()})),
    ("book", "'The Silent River' by Anna Berg was published in 2019 by Northlight Press and has 312 pages.",
     "the book's title, author, year, publisher and pages", _obj({"title": _s(), "author": _s(), "year": _i(1000, 2100),
                                                                  "publisher": _s(), "pages": _i(1, 5000)})),
    ("flight", "Flight LH 1234 leaves Frankfurt at 09:40 and lands in Oslo at 11:55.",
     "the flight number, origin, destination, departure and arrival times",
     _obj({"flight": _s(10), "from": _s(), "to": _s(), "departs": _s(8), "arrives": _s(8)})),
    ("weather", "Tomorrow in Berlin: light rain, a high of 14 degrees and a low of 8, wind 20 km/h.",
     "the city, conditions, high, low and wind speed", _obj({"city": _s(), "conditions": _s(), "high": _i(-60, 60),
                                                             "low": _i(-60, 60), "wind_kmh": _i(0, 300)})),
    ("invoice", "Invoice 2024-117 from Delta Tools to Brook & Sons: total 845 euros, due 30 April.",
     "the invoice number, seller, buyer, total and due date",
     _obj({"number": _s(20), "seller": _s(), "buyer": _s(), "total": _i(), "due": _s(20)})),
    ("movie", "Directed by Lena Ortiz, 'Glass Harbor' (2021) is a 118-minute drama starring Tom Reyes.",
     "the movie's title, director, year, length in minutes, genre and lead actor",
     _obj({"title": _s(), "director": _s(), "year": _i(1880, 2100), "minutes": _i(1, 1000), "genre": _s(20),
           "lead": _s()})),
    ("company", "Harbor Labs, founded in 2012 in Austin, employs about 450 people and makes medical sensors.",
     "the company's name, founding year, city, employees and products",
     _obj({"name": _s(), "founded": _i(1600, 2100), "city": _s(), "employees": _i(), "products": _s()})),
    ("match", "Real Betis beat Sevilla 2-1 on Sunday; Isco scored the winning goal in the 88th minute.",
     "the winner, loser, score of each and who scored the winner in which minute",
     _obj({"winner": _s(), "loser": _s(), "winner_goals": _i(0, 50), "loser_goals": _i(0, 50), "scorer": _s(),
           "minute": _i(0, 130)})),
    ("recipe", "Pancakes: 2 eggs, 250 ml milk, 120 g flour and a pinch of salt; cook for 3 minutes a side.",
     "the dish and its ingredients, each with name and amount",
     _obj({"dish": _s(), "ingredients": {"type": "array", "maxItems": 8, "items": _obj({"name": _s(20),
                                                                                          "amount": _s(20)})}})),
    ("address", "Send it to Dr. Ken Watanabe, 4-2-8 Shibakoen, Minato-ku, Tokyo 105-0011, Japan.",
     "the name, street, district, city, postal code and country",
     _obj({"name": _s(), "street": _s(), "district": _s(), "city": _s(), "postal_code": _s(12), "country": _s()})),
    ("review", "I loved the battery life but the screen scratches easily. 4 out of 5 stars. - Priya",
     "the reviewer, rating out of 5, one pro and one con", _obj({"reviewer": _s(), "rating": _i(1, 5), "pro": _s(),
                                                                 "con": _s()})),
    ("meeting", "Budget review with Sam and Ines on Thursday at 15:00 in room 4B, one hour.",
     "the meeting's topic, attendees, day, time, room and length in minutes",
     _obj({"topic": _s(), "attendees": {"type": "array", "items": _s(20), "maxItems": 6}, "day": _s(12),
           "time": _s(8), "room": _s(10), "minutes": _i(1, 600)})),
    ("order", "Order #5531: three blue mugs at 8 dollars each and one teapot at 25 dollars, shipped to Leeds.",
     "the order number, items with name, quantity and unit price, and the shipping city",
     _obj({"order": _s(12), "items": {"type": "array", "maxItems": 6, "items": _obj(
         {"name": _s(20), "quantity": _i(1, 1000), "unit_price": _i()})}, "city": _s()})),
    ("patient", "Patient John Doe, 58, reports chest pain since yesterday; blood pressure 150/95.",
     "the patient's name, age, symptom, onset and blood pressure",
     _obj({"name": _s(), "age": _i(0, 130), "symptom": _s(), "onset": _s(20), "blood_pressure": _s(10)})),
    ("sentiment", "The new update is slow and crashes every time I open the camera.",
     "the sentiment (positive, negative or neutral) and the topic",
     _obj({"sentiment": {"enum": ["positive", "negative", "neutral"]}, "topic": _s()})),
    ("country", "Chile has about 19 million people; its capital is Santiago and its currency is the peso.",
     "the country, population in millions, capital and currency",
     _obj({"country": _s(), "population_millions": _i(0, 2000), "capital": _s(), "currency": _s(20)})),
    ("job", "Senior Data Engineer, remote (EU), 70,000-85,000 EUR, Python and SQL required.",
     "the job title, location, minimum salary, maximum salary and required skills",
     _obj({"title": _s(), "location": _s(), "salary_min": _i(), "salary_max": _i(),
           "skills": {"type": "array", "items": _s(20), "maxItems": 6}})),
    ("car", "For sale: 2016 Toyota Corolla, 84,000 km, petrol, manual, 9,500 euros.",
     "the make, model, year, mileage in km, fuel, gearbox and price",
     _obj({"make": _s(20), "model": _s(20), "year": _i(1900, 2100), "km": _i(0, 2000000), "fuel": _s(12),
           "gearbox": {"enum": ["manual", "automatic"]}, "price": _i()})),
    ("hotel", "Two nights at Hotel Miramar, check-in 3 May, double room with breakfast, 180 euros a night.",
     "the hotel, check-in date, nights, room type, breakfast (true or false) and price per night",
     _obj({"hotel": _s(), "check_in": _s(20), "nights": _i(1, 365), "room": _s(20),
           "breakfast": {"type": "boolean"}, "price_per_night": _i()})),
    ("contact", "Call Olivia Chen at +44 20 7946 0958 or write to olivia.chen@example.org.",
     "the name, phone and email", _obj({"name": _s(), "phone": _s(20), "email": _s()})),
    ("trip", "We drove 430 km from Lyon to Nice in 5 hours and stopped twice.",
     "the origin, destination, distance in km, hours and stops",
     _obj({"origin": _s(), "destination": _s(), "km": _i(0, 100000), "hours": _i(0, 1000), "stops": _i(0, 100)})),
    ("course", "Intro to Statistics (STAT 101), taught by Prof. Amir Nasser, Mondays and Wednesdays, 4 credits.",
     "the course name, code, teacher, days and credits",
     _obj({"course": _s(), "code": _s(12), "teacher": _s(), "days": {"type": "array", "items": _s(12),
                                                                    "maxItems": 7}, "credits": _i(0, 30)})),
]


def records() -> list[dict]:
    return [{"id": name, "prompt": f"Text: {text}\nExtract {what} as JSON.\nJSON:", "schema": schema}
            for name, text, what, schema in ITEMS]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSONL to write")
    args = ap.parse_args()
    with open(args.out, "w") as f:
        for rec in records():
            f.write(json.dumps(rec) + "\n")
    print(f"wrote {len(ITEMS)} prompts to {args.out}")


if __name__ == "__main__":
    main()
