import streamlit as st

st.title('step_through')
