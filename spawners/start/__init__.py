"""A start, the same in both shapes: admitting it (admission.py, its options and the CPU
caps' traitlets), the spawn page (options_form.py, spawn_page.py), billing from the
launch and the wait for the server's first answer (launch_billing.py, first_answer.py)."""
