def find_stop(text, stop_sequences):
    for sequence in stop_sequences:  # mistake: the first in the list, not the first in the text
        at = text.find(sequence)
        if at != -1:
            return at
    return None
