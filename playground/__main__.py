from playground.launcher import main

main()
