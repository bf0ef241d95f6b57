
input 'x': bad