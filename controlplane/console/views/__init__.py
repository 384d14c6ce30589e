"""The console's pages: each module is a Streamlit page script that ``app.py``'s ``st.navigation`` runs."""
