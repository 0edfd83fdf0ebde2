import streamlit as st

st.title('lesson')
