"""How jobs arrive: the RunPod handlers and their result posts, the HTTP routes and their
admission, the OpenAI mapping. Only the entry points import this folder."""
