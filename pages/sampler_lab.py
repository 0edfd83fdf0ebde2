import streamlit as st

st.title('sampler_lab')
