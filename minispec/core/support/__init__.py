"""What the core calls and a first reading can skip: where an output ends (stops), the counters
a step fills and the metrics read from them (metrics), prompts to tokens and tokens to text (text).
These import the core's data types (request, batch) and nothing above them."""
